"""What every stage uses: error reporting, byte units, paths to the shipped files, atomic writes."""
