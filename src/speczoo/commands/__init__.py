"""Subcommands of the `speczoo` CLI, one module each.

Every module here defines `register(sub)`, which adds its parser to the argparse sub-parsers and sets
`func=run` on it; `run(args) -> int` parses nothing further and calls library code. The CLI finds the
modules by listing this package, so adding a command never means editing a central list. Modules whose
name starts with "_" hold helpers shared by commands (`_model_args`) and are not commands.
"""
