"""`rose run`: the embedded end-to-end job on one machine."""
