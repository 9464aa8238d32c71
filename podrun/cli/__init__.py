"""The command line: thin click commands (parse, call the library, render); rich lives only here."""
