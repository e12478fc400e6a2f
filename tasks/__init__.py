"""flctl's tasks, one file each (installed as the ``flctl_tasks`` package). See flctl/tasks.py."""
