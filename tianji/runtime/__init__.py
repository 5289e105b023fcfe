"""The event runtime: transports' protocol, typed events and their codec, bounded queues,
the service base class, the controller's registry, event-loop selection and plug-in
loading. It knows no RL and imports nothing above it (``tests/test_layers.py``)."""
