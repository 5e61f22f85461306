"""Which bytes each shard needs: shard specs and their inference, copy plans between shardings, and
shard views (a version as one tensor-parallel rank holds it)."""
