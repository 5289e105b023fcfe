"""An actor that gets weights before any buffer subscribed keeps its event loop running.

Regression: the actor's own wake-up event once shadowed ``Service._changed``; new weights
set it, and ``wait_subscribers`` then spun without ever yielding (100 % CPU, no heartbeats,
no handshakes answered, the weight link unread) until the run was killed.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import threading
from pathlib import Path

from tests.test_service_pubsub import running, until
from tianji.rl.balance import UNLIMITED
from tianji.rl.config import to_dict
from tianji.rl.events import GrantProduction, ParamsPublished, TrajectoryCollected
from tianji.rl.topics import LATEST_PARAMS, TRAJECTORIES
from tianji.run.config import load_config
from tianji.runtime import service as service_module
from tianji.runtime.controller import Controller
from tianji.runtime.service import Service
from tianji.services.actor import ActorService
from tianji.services.common import make_algorithm

ROOT = Path(__file__).resolve().parents[1]


class Params(Service):
    role = "params"


class Sink(Service):
    role = "buffer"

    def __init__(self, name: str, **kw: object) -> None:
        super().__init__(name, **kw)  # type: ignore[arg-type]
        self.fragments = 0
        self.subscribe(TRAJECTORIES, self.on_fragment)

    async def on_fragment(self, ev: TrajectoryCollected) -> None:
        self.fragments += 1


def test_weights_before_the_first_subscriber_do_not_stall_the_actor() -> None:
    # an actor collects only what the controller grants: this controller has no balancer,
    # the test grants by hand
    config = load_config(str(ROOT / "examples" / "cartpole_ppo.toml"), [])
    weights = make_algorithm(config, seed=0, device="cpu").get_weights()

    async def main() -> None:
        ctl = Controller(bind="inproc://")
        async with running(ctl):
            params = Params("params-0", controller=ctl.address, publishes=[LATEST_PARAMS])
            actor = ActorService("actor-0", config=to_dict(config), index=0, controller=ctl.address)
            async with running(params, actor):
                await until(lambda: "actor-0" in ctl.registry, timeout=30)
                grant = GrantProduction(limit=UNLIMITED, min_version=0, reason="by hand")
                assert await ctl.command("actor-0", grant)
                await params.wait_subscribers(LATEST_PARAMS)
                for version in (1, 2, 3):  # the actor waits for a buffer meanwhile
                    await params.publish(
                        ParamsPublished(policy_version=version, weights=weights), LATEST_PARAMS
                    )
                late = []  # the loop keeps turning: 10-ms timers fire (nearly) on time
                for _ in range(20):
                    started = asyncio.get_running_loop().time()
                    await asyncio.sleep(0.01)
                    late.append(asyncio.get_running_loop().time() - started - 0.01)
                assert max(late) < 0.25, late  # a blocked loop would hold them for seconds
                sink = Sink("buffer-0", controller=ctl.address)
                async with running(sink):
                    await until(lambda: sink.fragments >= 2, timeout=30)
                assert actor.policy_version == 3

    # In a daemon thread: a loop that spins synchronously cannot time itself out.
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(90)
    assert not thread.is_alive(), "the actor's event loop stalled (see the module docstring)"
    if errors:
        raise errors[0]


def test_no_service_overwrites_an_attribute_the_service_base_sets() -> None:
    # the parts a service owns (links, heartbeats, sharing, serving) keep their own state
    base = set(_assigned(inspect.getsource(service_module.Service)))
    import tianji.run.plan
    import tianji.runtime.controller
    import tianji.services.actor
    import tianji.services.buffer
    import tianji.services.inference
    import tianji.services.learner
    import tianji.services.monitor
    import tianji.services.params

    modules = [
        tianji.runtime.controller, tianji.services.actor, tianji.services.buffer,
        tianji.services.inference, tianji.services.learner, tianji.services.params,
        tianji.services.monitor, tianji.run.plan,
    ]  # fmt: skip
    for module in modules:
        clashes = base & set(_assigned(inspect.getsource(module)))
        assert not clashes, f"{module.__name__} reassigns Service attributes {sorted(clashes)}"


def _assigned(source: str) -> list[str]:
    """Private ``self._x`` attributes assigned anywhere in ``source``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and t.attr.startswith("_")
            ):
                names.append(t.attr)
    return names
