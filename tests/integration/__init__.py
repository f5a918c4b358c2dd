"""A real nats-server, real generated repositories built and timed in the jail, podman, chromium, checkov."""
