"""The `slurmrl` command line (click). Only this package prints."""
