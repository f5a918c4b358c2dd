"""The whole thing as a user runs it: the CLI, the deployment files, the cluster of processes."""
