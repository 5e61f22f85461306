"""Weights held in memory and updated in place: ``ResidentWeights``, the whole-or-nothing commit of a
staged version, in-place patches and the undo log that rolls them back."""
