from alibi.cli import entry

entry()
