"""Plain logic and handlers over fakes: no server, no compiler, no jail, no container."""
