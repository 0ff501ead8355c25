"""The entries of `make bench`'s table (bench/run.py): each exposes TITLE, DESCRIPTION and run() -> list of rows."""
