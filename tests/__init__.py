"""Every test folder is a package on purpose: pytest ends a `scope="package"` fixture (each suite's local
Ray stack, the local Kubernetes control plane) with its package only when the folder has an __init__.py;
in a plain folder it lives until the whole session ends, so every suite's stack stayed up through the
suites after it (tests/test_suite_layout.py keeps it so)."""
