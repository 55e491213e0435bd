"""Discovery: unknown machines boot the discovery image, report their hardware (facts), and
join the inventory when an operator approves them or a rule does (issue 15)."""
