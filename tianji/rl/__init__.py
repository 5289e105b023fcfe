"""The RL vocabulary, with no asyncio and no I/O: what an algorithm and a buffer are,
the RL events and topics, the buffers, the balance policy, the checkpoint format, envs,
the multi-agent adapter, the config sections and the algorithm registry. Algorithms
import from here only (``tests/test_layers.py``)."""
