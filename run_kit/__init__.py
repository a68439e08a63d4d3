"""What a run needs around the model and the loop: the keys, data windows and devices the scripts share
(common.py), the files a run keeps (run_files.py), its out_dir and record (run_dir.py), the checks around
the loop (run_control.py) and the routing diagnostics it logs (routing.py)."""
