"""Two records (or several machines) side by side: differences, verdicts, the machine probe, and their layouts."""
