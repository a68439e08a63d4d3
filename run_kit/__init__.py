"""What a run needs around the model and the loop: the keys the scripts share (common.py), the formats of the
files a run keeps (run_files.py), its start and record (run_dir.py), this process and the checks around the
loop (run_control.py), what it prints (console.py) and the routing diagnostics it logs (routing.py)."""
