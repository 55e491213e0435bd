"""The service layer: what the CLI and the API both call to read and change provisiond's
state, with the same validation, audit records and events (DESIGN.md section 10)."""
