"""What every layer stands on: errors, byte sizes, argument checks, files written whole, interrupts, input files,
process pools."""
