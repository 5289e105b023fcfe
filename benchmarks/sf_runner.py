"""Steady-state throughput of Sample Factory 2.1.1 APPO (learning on, CPU), beside tianji's
in ``python benchmarks/peers.py throughput``.

Standalone: it imports only the standard library and Sample Factory (plus its dependencies),
never tianji, because it runs under a separate interpreter. Create that venv once::

    python3.11 -m venv /work/sfvenv
    /work/sfvenv/bin/pip install torch==2.13.0
    /work/sfvenv/bin/pip install torch==2.13.0 numpy==1.26.4 gymnasium==0.29.1 \\
        opencv-python==4.11.0.86 ale-py==0.9.0 sample-factory==2.1.1

(pin torch in both calls: an unpinned torch pulls a multi-GB CUDA build). Then::

    /work/sfvenv/bin/python benchmarks/sf_runner.py --env cartpole|pong --workers W \\
        --envs-per-worker E --seconds S [--warmup S0] --train-dir DIR [--sf-args="FLAGS"]

trains APPO in-process through SF's own runner and, at the end, prints exactly one JSON line
on stdout (``system``, ``env``, ``workers``, ``envs_per_worker``, ``seconds``, ``env_steps``,
``frames``, ``env_steps_per_s``, ``frames_per_s``, ``consumed_per_s``, ``frameskip``,
``policy_lag``, ``model_params``, ``learner_threads``, ``processes``, ``settings``,
``sf_version``). Everything else -- SF's logs, its worker processes' output, ALE's banner --
goes to stderr (file descriptor 1 is pointed at stderr before anything starts) and to
``DIR/<experiment>/sf_log.txt``. Exit code 1 with a message on stderr when SF fails.

Settings are SF's own: ``pong`` is ``atari_pong`` (``PongNoFrameskip-v4``) with the defaults
of ``sf_examples/atari/atari_params.py`` (frameskip 4, framestack 4, 84x84 grey, the Atari
conv net, synchronous PPO: ``async_rl=False``, rollout 128, batch 256 x 4 minibatches x 4
epochs); ``cartpole`` is ``CartPole-v1`` with the command line of SF's
``sf_examples/train_gym_env.py`` docstring (no RNN, two policy workers, batch 512, reward scale
0.1, SF's default 512x512 MLP encoder). Only ``num_workers``, ``num_envs_per_worker``,
``device=cpu``, a huge ``train_for_env_steps`` and ``restart_behavior=overwrite`` are changed.

``--sf-args`` (whitespace-separated SF flags, e.g. ``--encoder_mlp_layers 64 64
--nonlinearity=tanh``) come after the example's flags, so they override them: ``benchmarks/peers.py
throughput`` passes its equal-work settings this way (``tianji.bench.throughput_work.sf_flags``).
``settings`` in the JSON are the values SF actually ran with (its parsed config) for what
decides the work: the encoder (``encoder_mlp_layers`` or ``encoder_conv_architecture`` with
``encoder_conv_mlp_layers``), ``nonlinearity``, ``actor_critic_share_weights``,
``rollout``, ``batch_size`` (SF's minibatch), ``num_batches_per_epoch``, ``num_epochs``,
``normalize_input``, ``normalize_returns``, ``async_rl``, ``worker_num_splits``,
``policy_workers_per_policy``. ``model_params`` counts the trainable parameters of the
actor-critic SF builds from that config (running-statistics buffers are not parameters).
``processes`` is what computes: ``env`` rollout workers, ``inference`` policy workers, one
``learner``. ``learner_threads`` is 1: SF 2.1.1 sets it, not a flag
(``learner_worker.py`` calls ``init_torch_runtime(cfg)``, whose ``max_num_threads=1``
makes ``torch.set_num_threads(1)``; inference workers do the same, rollout workers too).

Stopping: ``--train_for_seconds`` is a no-op in 2.1.1 (the runner never updates
``total_train_seconds``), so this script hooks a handler onto the runner's learner-report
messages and calls the runner's own stop path (``_stop_training``: final checkpoint, every
component stopped, every process joined) once the window is over. A watchdog timer in the
runner's event loop stops a run that never starts training or never finishes stopping, and
any child process still alive at exit is terminated, then killed.

Measurement: the learner reports its cumulative ``env_steps`` after every training iteration;
that counter is what SF's periodic log line ``Fps is (...). Total num frames: N`` prints.
It counts what the learner CONSUMED (``Learner.train`` adds each trained batch's
``experience_size``, invalid samples included: with ``max_policy_lag=1000`` there are none
here), not what the rollout workers produced, so ``env_steps`` and ``consumed_per_s`` are the
same count: agent steps trained on. (The rollout side's ``samples_collected`` arrives only
every few seconds per policy worker, too coarse for the window; it serves the cross-check
below only.) The
warm-up starts at the first training iteration (process start-up, model init and the first
rollouts are excluded); the window opens at the first report at least ``--warmup`` seconds
later and closes at the first report at least ``--seconds`` after that, so ``seconds`` is the
exact time between two reports and ``frames`` the exact count consumed between them.

What SF calls a frame: ``Learner.train`` adds ``experience_size * env_info.frameskip`` when
``summaries_use_frameskip`` is on (it is for Atari, and by default), with
``env_info.frameskip = cfg.env_frameskip``; the Atari env repeats each action 4 times
(``MaxAndSkipEnv(skip=cfg.env_frameskip)``). So for Pong SF's "frames" are emulator frames =
agent steps x 4; for CartPole (``env_frameskip=1``) frames = agent steps. Here ``env_steps``
is agent steps (observations trained on) and ``frames = env_steps * frameskip``. A cross-check
goes to stderr: SF's frames divided by the inference workers' count of agent steps (their
``samples_collected`` reports, from the warm-up start to the window end) gives ~4 for Pong and
~1 for CartPole.

``policy_lag`` is the mean of the learner's ``version_diff_avg`` summaries (SF's "Policy #0
lag" avg) received in the window, or null when none arrived.

Learning curves: ``--curve EVERY`` (with ``--warmup 0`` and ``--seconds`` the whole budget)
adds ``"curve"`` to the JSON: a point every EVERY seconds since launch with SF's frames, agent
steps and the mean true return of the last 20 episodes (``RecordEpisodeStatistics``' whole
games for Atari; SF's episode reward otherwise), as ``benchmarks/learning_curve.py`` prints
tianji's. SF's Pong is ``PongNoFrameskip-v4``: no sticky actions, unlike ``ALE/Pong-v5``.

Pitfall: in gymnasium 0.29 the ALE ids (``PongNoFrameskip-v4``) exist only after
``import ale_py``; SF's env processes are spawned, so the env factory imports it itself.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from sf_curve import Curve  # (this folder: the script's first import path)

SF_VERSION = "2.1.1"
STARTUP_TIMEOUT_S = 180.0  # process spawn + model init + first training iteration
STOP_TIMEOUT_S = 60.0  # from the stop request to every component having stopped

ENVS: dict[str, dict[str, Any]] = {
    "cartpole": {
        "sf_name": "CartPole-v1",
        "gym_id": "CartPole-v1",
        # the command line in sf_examples/train_gym_env.py's docstring, SF's CartPole example
        "argv": [
            "--use_rnn=False",
            "--policy_workers_per_policy=2",
            "--recurrence=1",
            "--with_vtrace=False",
            "--batch_size=512",
            "--reward_scale=0.1",
            "--save_every_sec=10",
            "--experiment_summaries_interval=10",
        ],
    },
    "pong": {
        "sf_name": "atari_pong",
        "gym_id": "PongNoFrameskip-v4",
        "argv": [],  # sf_examples.atari.atari_params.atari_override_defaults does it all
    },
}


def log(msg: str) -> None:
    print(f"[sf_runner] {msg}", file=sys.stderr, flush=True)


def make_cartpole(
    full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: str | None = None
) -> Any:
    """sf_examples/train_gym_env.py's factory (module-level: SF pickles it into workers)."""
    import gymnasium

    return gymnasium.make(full_env_name, render_mode=render_mode)


def make_atari(
    full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: str | None = None
) -> Any:
    """sf_examples' Atari factory, after ``import ale_py`` registers the ALE ids."""
    import ale_py  # noqa: F401  # type: ignore[import-not-found, unused-ignore]
    from sf_examples.atari.atari_utils import (  # type: ignore[import-not-found, unused-ignore]
        make_atari_env,
    )

    return make_atari_env(full_env_name, cfg, env_config, render_mode=render_mode)


@dataclass
class Window:
    """Learner reports -> the steady-state window; decides when to stop."""

    warmup: float
    seconds: float
    first_t: float | None = None  # first training iteration: warm-up starts
    first: tuple[float, int, int] | None = None  # (time, SF frames, samples collected)
    start: tuple[float, int, int] | None = None  # (time, SF frames, samples collected)
    end: tuple[float, int, int] | None = None
    lags: list[float] = field(default_factory=list)

    def on_steps(self, t: float, sf_frames: int, samples: int) -> bool:
        """Record one learner report; True once the window is complete."""
        if sf_frames <= 0 or self.end is not None:
            return self.end is not None
        if self.first_t is None:
            self.first_t = t
            self.first = (t, sf_frames, samples)
            log(f"training started; warm-up {self.warmup:.0f} s")
        elif self.start is None and t - self.first_t >= self.warmup:
            self.start = (t, sf_frames, samples)
            log(f"window opens at {sf_frames} SF frames")
        elif self.start is not None and t - self.start[0] >= self.seconds:
            self.end = (t, sf_frames, samples)
            log(f"window closes at {sf_frames} SF frames")
        return self.end is not None

    def on_lag(self, lag: float) -> None:
        if self.start is not None and self.end is None:
            self.lags.append(lag)


def build_cfg(args: argparse.Namespace) -> Any:
    from sample_factory.cfg.arguments import (  # type: ignore[import-not-found, unused-ignore]
        parse_full_cfg,
        parse_sf_args,
    )
    from sample_factory.envs.env_utils import (  # type: ignore[import-not-found, unused-ignore]
        register_env,
    )

    spec = ENVS[args.env]
    argv = [
        "--algo=APPO",
        f"--env={spec['sf_name']}",
        f"--experiment=sf_bench_{args.env}_w{args.workers}_e{args.envs_per_worker}",
        f"--train_dir={os.path.abspath(args.train_dir)}",
        f"--num_workers={args.workers}",
        f"--num_envs_per_worker={args.envs_per_worker}",
        "--device=cpu",
        "--train_for_env_steps=10000000000",
        "--restart_behavior=overwrite",
        "--with_wandb=False",
        *spec["argv"],
        *args.sf_args.split(),
    ]
    parser, partial = parse_sf_args(argv=argv)
    if args.env == "pong":
        from sf_examples.atari.atari_params import (  # type: ignore[import-not-found, unused-ignore]
            atari_override_defaults,
        )

        atari_override_defaults(partial.env, parser)
        register_env(spec["sf_name"], make_atari)
    else:
        register_env(spec["sf_name"], make_cartpole)
    return parse_full_cfg(parser, argv)


SETTINGS = (
    "encoder_mlp_layers",
    "encoder_conv_architecture",
    "encoder_conv_mlp_layers",
    "nonlinearity",
    "actor_critic_share_weights",
    "use_rnn",
    "rollout",
    "batch_size",
    "num_batches_per_epoch",
    "num_epochs",
    "normalize_input",
    "normalize_returns",
    "async_rl",
    "worker_num_splits",
    "policy_workers_per_policy",
)
"""The parsed config values that decide the work, reported as ``settings``."""
LEARNER_THREADS = 1
"""What SF 2.1.1's learner runs with: ``init_torch_runtime(cfg)`` (no flag sets it)."""


def model_facts(cfg: Any, env_info: Any) -> dict[str, Any]:
    """The work-deciding settings SF parsed and the trainable parameters of the
    actor-critic it builds from them (built here once more, only to count)."""
    from sample_factory.model.actor_critic import (  # type: ignore[import-not-found, unused-ignore]
        create_actor_critic,
    )

    model = create_actor_critic(cfg, env_info.obs_space, env_info.action_space)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    settings = {key: getattr(cfg, key) for key in SETTINGS if hasattr(cfg, key)}
    space = env_info.obs_space
    shape = space["obs"].shape if hasattr(space, "spaces") else space.shape
    # SF builds the conv encoder for images and the MLP otherwise, ignoring the other's
    # flags: report only the one in use
    unused = (
        ("encoder_mlp_layers",)
        if len(shape) > 1
        else ("encoder_conv_architecture", "encoder_conv_mlp_layers")
    )
    for key in unused:
        settings.pop(key, None)
    log(f"actor-critic: {params} trainable parameters; settings {settings}")
    return {"model_params": params, "settings": settings}


def run_sf(args: argparse.Namespace) -> dict[str, Any]:
    """Train until the window closes; return the JSON record. Raises RuntimeError on failure."""
    from sample_factory.algo.utils.misc import (  # type: ignore[import-not-found, unused-ignore]
        EPISODIC,
        LEARNER_ENV_STEPS,
        TRAIN_STATS,
        ExperimentStatus,
    )
    from sample_factory.train import make_runner  # type: ignore[import-not-found, unused-ignore]
    from signal_slot.signal_slot import (  # type: ignore[import-not-found, unused-ignore]
        EventLoopObject,
        Timer,
    )

    class Watchdog(EventLoopObject):  # type: ignore[misc, unused-ignore]
        """Signal-slot receiver (slots must be methods of an EventLoopObject)."""

        def tick(self) -> None:
            watchdog()

    cfg = build_cfg(args)
    cfg, runner = make_runner(cfg)
    window = Window(warmup=args.warmup, seconds=args.seconds)
    curve = Curve(every=args.curve) if args.curve else None
    frameskip_of_env = int(cfg.env_frameskip) if cfg.summaries_use_frameskip else 1
    launched = time.monotonic()
    stop_requested: list[float] = []  # time of the stop request, once made
    failure: list[str] = []

    def request_stop(reason: str, failed: bool = False) -> None:
        if not stop_requested:
            stop_requested.append(time.monotonic())
            log(f"stopping: {reason}")
            if failed:
                failure.append(reason)
            runner._stop_training(failed=failed)

    def on_env_steps(_runner: Any, msg: dict[str, Any], policy_id: int) -> None:
        # runs after SF's own handler, so runner.env_steps is up to date
        now = time.monotonic()
        done = window.on_steps(
            now, int(msg[LEARNER_ENV_STEPS]), int(runner.samples_collected[policy_id])
        )
        if curve is not None:
            curve.on_steps(now - launched, int(msg[LEARNER_ENV_STEPS]), frameskip_of_env, done)
        if done:
            request_stop("window complete")

    def on_episodic(_runner: Any, msg: dict[str, Any], policy_id: int) -> None:
        if curve is not None:
            curve.on_episodes(msg[EPISODIC])

    def on_train_stats(_runner: Any, msg: dict[str, Any], policy_id: int) -> None:
        lag = msg[TRAIN_STATS].get("version_diff_avg")
        if lag is not None:
            window.on_lag(float(lag))

    def watchdog() -> None:
        now = time.monotonic()
        if stop_requested:
            if now - stop_requested[0] > STOP_TIMEOUT_S:
                log("components did not stop in time; leaving the event loop")
                runner.event_loop.stop()
        elif window.first_t is None and now - launched > STARTUP_TIMEOUT_S:
            request_stop(f"no training iteration within {STARTUP_TIMEOUT_S:.0f} s", failed=True)

    runner.policy_msg_handlers[LEARNER_ENV_STEPS].append(on_env_steps)
    runner.policy_msg_handlers[TRAIN_STATS].append(on_train_stats)
    runner.policy_msg_handlers[EPISODIC].append(on_episodic)

    status = runner.init()
    if status != ExperimentStatus.SUCCESS:
        raise RuntimeError(
            f"Sample Factory failed to initialise (status {status}); see its log above"
        )
    facts = model_facts(cfg, runner.env_info)
    timer = Timer(runner.event_loop, 1.0)
    timer.timeout.connect(Watchdog(runner.event_loop, "sf_runner_watchdog").tick)
    status = runner.run()
    if failure:
        raise RuntimeError(failure[0])
    if window.start is None or window.end is None:
        raise RuntimeError(f"Sample Factory stopped before the window closed (status {status})")

    t0, f0, _ = window.start
    t1, f1, s1 = window.end
    frameskip = int(cfg.env_frameskip)
    sf_frames = f1 - f0
    if cfg.summaries_use_frameskip:
        env_steps, frames = sf_frames // frameskip, sf_frames
    else:
        env_steps, frames = sf_frames, sf_frames * frameskip
    elapsed = t1 - t0
    if window.first is not None and s1 > window.first[2]:
        # samples_collected arrives every 3 s per inference worker: coarse, so take the
        # longest span (warm-up start to window end)
        ratio = (f1 - window.first[1]) / (s1 - window.first[2])
        log(f"cross-check: SF frames / sampled agent steps = {ratio:.2f} (frameskip {frameskip})")
    lag = sum(window.lags) / len(window.lags) if window.lags else None
    return {
        "system": "sample-factory",
        "env": ENVS[args.env]["gym_id"],
        "workers": args.workers,
        "envs_per_worker": args.envs_per_worker,
        "seconds": round(elapsed, 3),
        "env_steps": env_steps,
        "frames": frames,
        "env_steps_per_s": round(env_steps / elapsed, 1),
        "frames_per_s": round(frames / elapsed, 1),
        "consumed_per_s": round(env_steps / elapsed, 1),  # the learner's count: see above
        "frameskip": frameskip,
        "policy_lag": None if lag is None else round(lag, 3),
        "learner_threads": LEARNER_THREADS,
        "processes": {
            "env": int(cfg.num_workers),
            "inference": int(cfg.policy_workers_per_policy) * int(cfg.num_policies),
            "learner": int(cfg.num_policies),
        },
        **facts,
        "sf_version": SF_VERSION,
        **({"curve": curve.points} if curve is not None else {}),
    }


def reap_children() -> None:
    """Terminate, then kill, any worker process SF left behind."""
    children = multiprocessing.active_children()
    for child in children:
        log(f"terminating leftover process {child.name} (pid {child.pid})")
        child.terminate()
    for child in children:
        child.join(5.0)
        if child.is_alive():
            child.kill()
            child.join(5.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--env", choices=sorted(ENVS), required=True)
    p.add_argument("--workers", type=int, required=True, help="SF num_workers")
    p.add_argument("--envs-per-worker", type=int, required=True, help="SF num_envs_per_worker")
    p.add_argument("--seconds", type=float, required=True, help="measured window (s)")
    p.add_argument("--warmup", type=float, default=15.0, help="after the first update (s)")
    p.add_argument("--train-dir", required=True, help="SF's train_dir (logs, checkpoints)")
    p.add_argument(
        "--sf-args",
        default="",
        metavar="FLAGS",
        help="SF flags appended after the example's (they override it); whitespace-separated, "
        'given as --sf-args="--rollout=64 --encoder_mlp_layers 64 64"',
    )
    p.add_argument(
        "--curve",
        type=float,
        default=0.0,
        metavar="EVERY",
        help="also record a learning curve point every EVERY seconds (a learning run: use "
        "--warmup 0 and --seconds for the whole budget)",
    )
    args = p.parse_args(argv)
    if args.workers < 1 or args.envs_per_worker < 1 or args.seconds <= 0 or args.warmup < 0:
        p.error("--workers and --envs-per-worker must be >= 1, --seconds > 0, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # stdout carries only the JSON line: keep the real stdout aside and point fd 1 (inherited
    # by every process SF spawns) at stderr
    sys.stdout.flush()
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # SF's event loop turns it into an orderly exit

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        record = run_sf(args)
    except (Exception, KeyboardInterrupt) as exc:
        log(f"error: Sample Factory run failed: {type(exc).__name__}: {exc}")
        return 1
    finally:
        reap_children()
    json_out.write(json.dumps(record) + "\n")
    json_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
