from provisiond.cli import entry

entry()
