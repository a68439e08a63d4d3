"""The course kit's instructor side (COURSE.md, "For instructors"): grader.py decides the marks and never runs
student code; worker.py runs a submission's probes inside the sandbox. Neither is in a student's handout;
course.py is the command."""
