"""The model's depth reads computed another way, with the same numbers as model.py's plain read: in two
phases per AttnRes block (two_phase_read.py, train.py's depth_read='two_phase')."""
