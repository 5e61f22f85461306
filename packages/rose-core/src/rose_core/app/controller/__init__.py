"""The controller: executor registry, turn dispatch, status stream."""
