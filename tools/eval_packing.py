#!/usr/bin/env python3
"""Packing fidelity: does an utterance come back with the same text when other clients speak at
the same moment as when it is decoded alone?

Packing several short utterances into one 30 s Whisper window is where most CPU throughput comes
from, but Whisper then hears the neighbours as context and some transcripts change. This tool
measures how often, in the situations a server meets, through the real engine and the real
scheduler (in-process, no HTTP):

- ``alone``: one client at a time (every job alone in its batch);
- ``N``: N clients speak at once (groups of N utterances submitted together, each group waited
  for before the next), with the server's packing policy (``asr_pack_min_waiting``,
  ``asr_pack_min_saving_s``, ``asr_max_batch``);
- ``N-packed``: the same, but packing every batch of two or more: packing's own fidelity.

The corpus is 64 Piper sentences (vocoder noise off, identical on every run) plus the repository's
audio fixtures; each utterance appears in ``--mixes`` different random groups per scenario.
Reported per scenario: the share of utterances whose normalized text (lower case, no punctuation)
differs from its solo decode, WER against the reference text for solo and for the scenario on the
same utterances, the share of jobs that were packed, and throughput (audio s per wall s).

    python tools/eval_packing.py [--model tiny.en|base] [--scenarios alone,8,16,8-packed]
                                 [--mixes 3] [--gap-s 1.0] [--json PATH]

CPU kernels differ between machines (CTranslate2 picks MKL on Intel, oneDNN elsewhere, and the
widest ISA available); to see another machine's behaviour on this one, run with e.g.
``CT2_USE_MKL=0 CT2_FORCE_CPU_ISA=AVX2``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speech_corpus import Utterance, fixtures, synthesize

from tests import wer
from tests.wer import normalize


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    return wer.corpus_wer(references, hypotheses) or 0.0


@dataclass
class ScenarioResult:
    name: str
    clients: int
    always_pack: bool
    utterances: int = 0
    changed: int = 0
    wer_solo: float = 0.0
    wer_scenario: float = 0.0
    packed_share: float = 0.0
    throughput: float = 0.0
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # reference, solo, scenario

    @property
    def changed_share(self) -> float:
        return self.changed / self.utterances if self.utterances else 0.0


def parse_scenario(name: str) -> tuple[int, bool]:
    if name == "alone":
        return 1, False
    clients, _, suffix = name.partition("-")
    if not clients.isdigit() or suffix not in ("", "packed"):
        raise SystemExit(f"unknown scenario {name!r}: use alone, N or N-packed")
    return int(clients), suffix == "packed"


def main() -> None:
    from mediaserver.asr.engine import AsrJob, WhisperEngine
    from mediaserver.asr.models import assemble_base_model, bundled_tiny_en_dir
    from mediaserver.asr.scheduler import AsrScheduler
    from mediaserver.asr.windows import PackingConfig
    from mediaserver.config import Settings
    from mediaserver.events import Transcript, TranscriptionOptions

    settings = Settings()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    parser.add_argument("--scenarios", default="alone,8,16,8-packed")
    parser.add_argument("--mixes", type=int, default=3, help="random groups each utterance appears in, per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gap-s", type=float, default=settings.asr_pack_gap_s)
    parser.add_argument("--json", type=Path, help="write the results (with every changed transcript) here")
    args = parser.parse_args()

    model_dir = str(
        bundled_tiny_en_dir()
        if args.model == "tiny.en"
        else assemble_base_model(settings.model_cache_dir, progress=False)
    )
    threads = os.cpu_count() or 1
    utterances: list[Utterance] = synthesize() + fixtures()
    options = TranscriptionOptions(language="en", with_segment_timestamps=False)
    audio_s = sum(u.seconds for u in utterances)
    kernels = {k: v for k, v in os.environ.items() if k.startswith("CT2_")}
    print(f"model {args.model}, {len(utterances)} utterances ({audio_s:.0f} s), {threads} threads, kernels {kernels}")

    def engine(always_pack: bool, enabled: bool = True) -> WhisperEngine:
        packing = PackingConfig(
            enabled=enabled,
            gap_s=args.gap_s,
            max_job_s=settings.asr_pack_max_job_s,
            max_window_s=settings.asr_pack_max_window_s,
            min_waiting=2 if always_pack else (settings.asr_pack_min_waiting or settings.asr_max_batch + 1),
            min_saving_s=0.0 if always_pack else settings.asr_pack_min_saving_s,
        )
        return WhisperEngine(args.model, model_dir, cpu_threads=threads, packing=packing)

    def text_of(result: Transcript | BaseException) -> str:
        return result.text if isinstance(result, Transcript) else f"<error {result!r}>"

    solo_engine = engine(False, enabled=False)
    solo = [text_of(solo_engine.transcribe_batch([AsrJob(u.audio, options)])[0]) for u in utterances]
    print(f"solo decodes done: WER {corpus_wer([u.text for u in utterances], solo) * 100:.2f} %")

    async def run(name: str) -> ScenarioResult:
        clients, always_pack = parse_scenario(name)
        eng = engine(always_pack)
        # Warm up, as a running server is: this also lets the packing policy measure a window's cost.
        eng.transcribe_batch([AsrJob(u.audio, options) for u in utterances[:2]])
        before = dict(eng.counters)
        scheduler = AsrScheduler(
            args.model,
            eng.transcribe_batch,
            max_batch=settings.asr_max_batch,
            max_wait_ms=settings.asr_max_wait_ms,
            max_collect_ms=settings.asr_max_collect_ms,
            max_queue=max(settings.asr_max_queue, clients),
        )
        rng = random.Random(f"{args.seed}-{name}")
        groups: list[list[int]] = []
        for _ in range(args.mixes):
            order = list(range(len(utterances)))
            rng.shuffle(order)
            groups += [order[i : i + clients] for i in range(0, len(order), clients)]
        result = ScenarioResult(name, clients, always_pack)
        refs: list[str] = []
        solos: list[str] = []
        hyps: list[str] = []
        started = time.perf_counter()
        try:
            for group in groups:
                outs = await asyncio.gather(
                    *(scheduler.submit(AsrJob(utterances[i].audio, options)) for i in group), return_exceptions=True
                )
                for index, out in zip(group, outs, strict=True):
                    text = text_of(out)
                    refs.append(utterances[index].text)
                    solos.append(solo[index])
                    hyps.append(text)
                    if normalize(text) != normalize(solo[index]):
                        result.changed += 1
                        result.changes.append((utterances[index].text, solo[index], text))
        finally:
            await scheduler.aclose()
        wall_s = time.perf_counter() - started
        result.utterances = len(hyps)
        result.wer_solo = corpus_wer(refs, solos)
        result.wer_scenario = corpus_wer(refs, hyps)
        packed = eng.counters["jobs_packed"] - before["jobs_packed"]
        alone = eng.counters["jobs_alone"] - before["jobs_alone"]
        result.packed_share = packed / max(1, packed + alone)
        result.throughput = sum(utterances[i].seconds for g in groups for i in g) / wall_s
        return result

    results = [asyncio.run(run(name.strip())) for name in args.scenarios.split(",") if name.strip()]
    print()
    print(
        f"{'scenario':12s} {'utts':>5s} {'changed':>8s} {'share':>7s} {'WER solo':>9s} {'WER here':>9s} "
        f"{'packed':>7s} {'audio s/s':>10s}"
    )
    for r in results:
        print(
            f"{r.name:12s} {r.utterances:5d} {r.changed:8d} {r.changed_share * 100:6.2f}% {r.wer_solo * 100:8.2f}% "
            f"{r.wer_scenario * 100:8.2f}% {r.packed_share * 100:6.1f}% {r.throughput:10.1f}"
        )
    for r in results:
        unique = sorted(set(r.changes))
        if unique:
            print(f"\n{r.name}: {len(unique)} distinct changes (reference | solo -> here)")
            for reference, before_text, after in unique:
                print(f"  {reference!r} | {before_text!r} -> {after!r}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload: dict[str, object] = {"args": {k: str(v) for k, v in vars(args).items()}, "kernels": kernels}
        payload["scenarios"] = [asdict(r) | {"changed_share": r.changed_share} for r in results]
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
