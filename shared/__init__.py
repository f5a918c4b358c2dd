"""Code every cppperf service shares: messages, settings, bus, store, logging."""
