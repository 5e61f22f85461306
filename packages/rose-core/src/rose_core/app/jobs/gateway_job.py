"""The RL job with its rollouts brought by agents through the rollout gateway (``rl.env = "gateway"``).

Everything but the rollout is ``RLJob``'s: train, ship weights, checkpoints, reports. A step's rollout is the
next ``rl.prompts_per_step`` complete groups of gateway sessions (``rl.group_size`` sessions closed by their
rewards), oldest first; groups completed beyond that wait for the next step. Each call of a session is one
turn, submitted on the controller's loop (the job's ``on_tick`` hook) with the step's version window. A
synchronous job (``scheduler.staleness = 0``) holds new calls while it trains and ships, so every turn runs
on the newest weights; an asynchronous one keeps routing them (window ``[T - staleness, T]``).
Dynamic sampling drops groups without reward spread (they carry no gradient); nothing is refilled here: the
agents decide what runs. No held-out evaluation (``rl.eval.every`` is for built-in environments).
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from rose_core.app.config import RunConfig
from rose_core.app.controller.controller import Controller
from rose_core.app.controller.job_hooks import AcceptedTurn, TurnPayload
from rose_core.app.gateway.chat_template import ChatTemplate
from rose_core.app.gateway.gateway import Gateway, GatewayLimits
from rose_core.app.gateway.group_journal import GroupJournal
from rose_core.app.gateway.http_server import GatewayServer, ServerLimits
from rose_core.app.gateway.reply_parser import ReplyParser
from rose_core.app.gateway.session_table import SessionLimits, SessionTable, serial_of
from rose_core.app.gateway.turn_bridge import TurnBridge, TurnOutcome
from rose_core.app.jobs.rl_job import RLJob
from rose_core.app.jobs.step_report import StepReport
from rose_core.app.jobs.step_rollout import StepRollout
from rose_core.protocol.messages import StepStarted
from rose_core.scheduler import GivenUp, TurnTicket
from rose_core.support.errors import ConfigError, RoseError

log = logging.getLogger(__name__)


def gateway_key(config: RunConfig) -> tuple[str, Path]:
    """The agents' bearer key (the gateway's), and its file: ``gateway.key_file``, else ``<run_dir>/gateway.key``."""
    return bearer_key(config.gateway.key_file, Path(config.run_dir) / "gateway.key", "gateway.key_file")


def trainer_key(config: RunConfig) -> tuple[str, Path]:
    """The external trainer's bearer key (the trainer API's; never an agent's), and its file:
    ``rl.trainer.key_file``, else ``<run_dir>/trainer.key``."""
    return bearer_key(config.rl.trainer.key_file, Path(config.run_dir) / "trainer.key", "rl.trainer.key_file")


def _group_journal(config: RunConfig) -> GroupJournal | None:
    """Where complete groups wait for the checkpoint that covers them; none when the job does not checkpoint
    (nothing to resume from)."""
    rl = config.rl
    if rl.checkpoint.every <= 0:
        return None
    return GroupJournal(Path(rl.checkpoint.dir or Path(config.run_dir) / "checkpoints") / "gateway-groups")


def server_limits(config: RunConfig) -> ServerLimits:
    """The gateway's and the trainer API's connection limits (``[gateway]``)."""
    return ServerLimits(max_connections=config.gateway.max_connections, idle_timeout_s=config.gateway.idle_timeout_s)


def bearer_key(chosen: str, default: Path, setting: str) -> tuple[str, Path]:
    """A key and its file: ``chosen`` as it is (at least 16 characters), else ``default``: the key already there
    (a restarted job keeps its clients' key), or a new one written 0600. Called once per job."""
    path = Path(chosen or default).expanduser().resolve()
    if chosen or path.is_file():
        try:
            key = path.read_text().strip()
        except OSError as exc:
            raise RoseError(f"cannot read {setting} {path} ({exc}): fix the path, or leave it empty for a "
                            "new key") from exc
        if len(key) < 16:
            raise RoseError(f"{setting} {path} holds a key of {len(key)} characters: use at least 16")
        return key, path
    key = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(key + "\n")
    return key, path


class GatewayJob(RLJob):
    def __init__(self, controller: Controller, config: RunConfig, *args: Any, policy_dir: Path, key: str,
                 **kwargs: Any) -> None:
        super().__init__(controller, config, *args, **kwargs)
        rl, gw = config.rl, config.gateway
        journal = _group_journal(config)
        self._recovered = journal.recover() if journal is not None else []
        if self._recovered:
            log.info("gateway: %d complete group(s) journaled before a restart: trained again with --resume, "
                     "discarded otherwise", len(self._recovered))
        self._trained: dict[int, list[int]] = {}
        """Step -> the serials of the groups it trained (their journal files go once a checkpoint covers it)."""
        self.table = SessionTable(rl.group_size, SessionLimits(
            max_sessions=gw.max_sessions, max_metadata_bytes=gw.max_metadata_bytes,
            max_calls=gw.max_calls_per_session, idle_s=gw.session_idle_s), journal=journal,
            first_serial=max((group.serial for group in self._recovered), default=0))
        self.bridge = TurnBridge(controller.wake)
        limits = GatewayLimits(max_prompt_tokens=rl.max_context_tokens, max_tokens=rl.max_tokens_per_turn,
                               temperature=rl.sampling.temperature, turn_timeout_s=gw.turn_timeout_s)
        template = _chat_template(policy_dir)
        self.gateway = Gateway(self.table, self.bridge, self.codec, template, limits,
                               parser=_reply_parser(gw.tool_parser, gw.reasoning_parser, template))
        self.server = GatewayServer(self.gateway, key, gw.host, gw.port, server_limits(config)).start()
        self.closers.append(self.server.close)
        self.accepting = False

    def _environment(self) -> Any:
        return None  # the agents are the environment

    def close(self) -> None:
        self.accepting = False
        super().close()

    # ---------------------------------------------------------------- the loop's hooks

    def on_result(self, accepted: AcceptedTurn) -> None:
        if self.bridge.resolve(TurnOutcome(accepted.result, accepted.role)) and self._rollout is not None:
            self._rollout.count(accepted)

    def on_given_up(self, given_up: GivenUp) -> None:
        """The agent's call gets a 502; its session goes on (the agent may retry the call)."""
        self.bridge.fail(given_up.ticket.turn_id, given_up.reason)

    def on_tick(self, now: float) -> None:
        """Submit the calls waiting, then take the groups the step still needs (the step's script waits for
        them); the step's status as the rollout goes."""
        for turn_id in self.bridge.take_abandoned():
            self.controller.withdraw_turn(turn_id)
        self._submit_calls(now)
        rollout = self._rolling_out
        if rollout is not None:
            self._take_groups(rollout)
        super().on_tick(now)

    def _submit_calls(self, now: float) -> None:
        """Submit the calls waiting, with the step's window; a synchronous job holds them once the step has its
        groups (it is about to train: they run on the version it ships)."""
        rollout = self._rollout
        if not self.accepting or rollout is None:
            return
        if self.config.scheduler.staleness == 0 and rollout.groups + self.table.counts()[1] >= \
                self.config.rl.prompts_per_step:
            return
        lo, hi = rollout.window
        for turn in self.bridge.take():
            payload = TurnPayload(np.asarray(turn.prompt_token_ids, dtype=np.int32), turn.sampling, rollout.step)
            self.controller.submit_turn(TurnTicket(turn.turn_id, turn.session_id, lo, hi, now, payload=payload))

    def resume(self, path: Path) -> int:
        """RLJob's resume, and the complete groups journaled before the restart back in the table."""
        step = super().resume(path)
        if self._recovered and self.table.journal is not None:
            for group in self._recovered:
                self.table.journal.save(group)
            self.table.restore(self._recovered)
            log.info("gateway: %d complete group(s) from before the restart are waiting to be trained",
                     len(self._recovered))
        self._recovered = []
        return step

    def checkpoint(self, step: int, report: StepReport, *, last: bool = False) -> str:
        """RLJob's checkpoint; once written, the journal forgets the groups of the steps it covers."""
        path = super().checkpoint(step, report, last=last)
        if path and self.table.journal is not None:
            covered = [s for s in self._trained if s <= step]
            self.table.journal.drop([serial for s in covered for serial in self._trained.pop(s)])
        return path

    def _take_groups(self, rollout: StepRollout) -> None:
        wanted = self.config.rl.prompts_per_step
        for group in self.table.take_groups(wanted - rollout.groups):
            self._trained.setdefault(rollout.step, []).append(serial_of(group[0]))
            for trajectory in group:
                rollout.sessions.append(trajectory)
                self.controller.finish_trajectory(trajectory.trajectory_id)
            rollout.groups += 1
            self._offer_group(rollout, list(group))
        rollout.check_complete(rollout.groups >= wanted)

    # ---------------------------------------------------------------- RLJob's rollout, from the gateway

    def _start_rollout(self, step: int, *, ahead: bool = False) -> StepRollout:
        top = self.version + (1 if ahead else 0)
        rollout = StepRollout(step, self.version, (max(0, top - self.config.scheduler.staleness), top))
        self._rollout = rollout
        self.controller.broadcast(StepStarted(step=step, weight_version=self.version))
        self.accepting = True
        self._set_phase(rollout, "rollout")
        return rollout

    def _drive(self, rollout: StepRollout, deadline: float) -> None:
        timeout = self.config.gateway.step_timeout_s
        until = time.monotonic() + timeout if timeout > 0 else float("inf")
        self._rolling_out = rollout
        try:
            complete = self.loop.wait(rollout.complete, until)
        finally:
            self._rolling_out = None
        if not complete:
            raise RoseError(f"step {rollout.step}: {rollout.groups} of {self.config.rl.prompts_per_step} session "
                            f"groups completed in {timeout:.0f} s (gateway.step_timeout_s): are the agents running?")
        if self.config.scheduler.staleness == 0:
            self.accepting = False  # calls wait for the next version (they are taken when its rollout starts)

    def _refill(self, rollout: StepRollout, deadline: float) -> None:
        """The agents decide what is rolled out: groups without reward spread are dropped, not refilled."""

    def _set_phase(self, rollout: StepRollout, phase: str, report: Any = None) -> None:
        super()._set_phase(rollout, phase, report)
        status = self.step_status
        if status is not None:
            sessions, _ = self.table.counts()
            status.trajectories_total = len(rollout.sessions) + sessions
            status.trajectories_done = len(rollout.sessions)


def _reply_parser(tool_parser: str, reasoning_parser: str, template: ChatTemplate | None) -> ReplyParser | None:
    """vLLM's parsers for the replies when ``[gateway]`` names one (they read the chat API's replies)."""
    if not (tool_parser or reasoning_parser):
        return None
    if template is None:
        raise ConfigError("[gateway] tool_parser / reasoning_parser need the chat API, and the policy has no chat "
                          "template: give its tokenizer one, or leave both empty")
    return ReplyParser(tool_parser, reasoning_parser, template.tokenizer)


def _chat_template(policy_dir: Path) -> ChatTemplate | None:
    """The policy's chat template, or None when it has none (the chat API then says so; completions work)."""
    try:
        return ChatTemplate(policy_dir)
    except RoseError as exc:
        log.warning("gateway: %s", exc)
        return None
