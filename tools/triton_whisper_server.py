"""A real Triton Inference Server that serves Whisper on the CPU behind the TensorRT-LLM example's interface.

NVIDIA's TensorRT-LLM Whisper example serves a Triton model ``infer_bls``: inputs ``WAV`` (FP32
[-1], 16 kHz mono, zero-padded in a batch), optional ``WAV_LENS`` (INT32 [1], the real length of
each row) and ``MAX_NEW_TOKENS`` (INT32 [1]), ``TEXT_PREFIX`` (BYTES [1], the decoder prompt such
as ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``, optionally followed by text the
transcript must start with); output ``TRANSCRIPTS`` (BYTES [1]). That model needs a GPU. This script
serves the same interface from a ``tritonserver`` started by PyTriton (the ``nvidia-pytriton``
wheel, which runs on the CPU), with the inference done by CTranslate2 Whisper through
faster-whisper, so mediaserver's ``triton`` backend and ``tools/bench_dataset.py --target triton``
can be run and tested against a real Triton on any machine.

Each Triton batch (one request with several rows, or several requests merged by Triton's dynamic
batcher) is encoded and decoded as one CTranslate2 batch, as the TensorRT-LLM model does.

It runs in a venv of its own (PyTriton's Python backend stub needs Debian's Python 3.11, not
pyenv's; see docs/scaling.md)::

    /usr/bin/python3.11 -m venv /opt/triton-venv
    /opt/triton-venv/bin/pip install nvidia-pytriton "numpy<2" "faster-whisper>=1.1,<1.3"
    /opt/triton-venv/bin/python tools/triton_whisper_server.py --model-dir /path/to/ct2-whisper \\
        --http-port 8000 --grpc-port 8001 --metrics-port 8002

Nothing in this file imports mediaserver: it runs with the venv's own packages only.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import signal
import sys
import threading
from typing import Any

import numpy as np

log = logging.getLogger("triton_whisper_server")

SAMPLE_RATE_HZ = 16000
WINDOW_SAMPLES = 30 * SAMPLE_RATE_HZ
_SPECIAL = re.compile(r"(<\|[^|>]*\|>)")


class WhisperBatcher:
    """Decodes a batch of ≤ 30 s clips in one CTranslate2 call, prompted by each row's TEXT_PREFIX."""

    def __init__(self, model_dir: str, cpu_threads: int) -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=cpu_threads)
        self.hf = self.model.hf_tokenizer
        self.sot = self.hf.token_to_id("<|startoftranscript|>")
        self.eot = self.hf.token_to_id("<|endoftext|>")
        self.lock = threading.Lock()

    def prompt(self, text_prefix: str) -> tuple[list[int], int]:
        """Token ids for a TEXT_PREFIX (special tokens, then the text the transcript must start with),
        and how many special tokens it has."""
        ids: list[int] = []
        special = 0
        for part in _SPECIAL.split(text_prefix):
            if not part:
                continue
            if _SPECIAL.fullmatch(part):
                token = self.hf.token_to_id(part)
                if token is None:
                    raise ValueError(f"TEXT_PREFIX has a token this model does not know: {part}")
                ids.append(token)
                special += 1
            elif part.strip():
                ids.extend(self.hf.encode(" " + part.strip(), add_special_tokens=False).ids)
        if not ids or ids[0] != self.sot:
            raise ValueError("TEXT_PREFIX must start with <|startoftranscript|>")
        return ids, special

    def decode(self, clips: list[np.ndarray], prefixes: list[str], max_new_tokens: list[int]) -> list[str]:
        from faster_whisper.audio import pad_or_trim

        prompts = [self.prompt(p) for p in prefixes]
        features = np.stack(
            [pad_or_trim(self.model.feature_extractor(clip[:WINDOW_SAMPLES].astype(np.float32))) for clip in clips]
        )
        # CTranslate2 decodes a batch together only when every row has as many task tokens after
        # <|startoftranscript|>: rows are grouped by their special-token prompt.
        groups: dict[int, list[int]] = {}
        for row, (_, special) in enumerate(prompts):
            groups.setdefault(special, []).append(row)
        sequences: dict[int, list[int]] = {}
        with self.lock:  # one CTranslate2 call at a time; it uses every CPU thread itself
            for rows in groups.values():
                encoded = self.model.encode(features[rows])
                results = self.model.model.generate(
                    encoded,
                    [prompts[r][0] for r in rows],
                    beam_size=1,
                    max_length=min(
                        self.model.max_length,
                        max(len(prompts[r][0]) for r in rows) + max(max_new_tokens[r] for r in rows),
                    ),
                    suppress_blank=True,
                    suppress_tokens=[-1],
                )
                for r, result in zip(rows, results, strict=True):
                    sequences[r] = result.sequences_ids[0]
        texts = []
        for row in range(len(prompts)):
            # The result holds the prompt's text tokens too: a forced prefix starts the transcript.
            texts.append(self.hf.decode([t for t in sequences[row] if t < self.eot]).strip())
        return texts


def serve(args: argparse.Namespace) -> None:
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    whisper = WhisperBatcher(args.model_dir, args.cpu_threads)

    @batch  # type: ignore[untyped-decorator]
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        wav = inputs["WAV"]
        rows = wav.shape[0]
        lens = inputs.get("WAV_LENS")
        tokens = inputs.get("MAX_NEW_TOKENS")
        clips = [wav[i, : int(lens[i][0])] if lens is not None else wav[i] for i in range(rows)]
        prefixes = [bytes(inputs["TEXT_PREFIX"][i][0]).decode("utf-8") for i in range(rows)]
        limits = [int(tokens[i][0]) if tokens is not None else args.max_new_tokens for i in range(rows)]
        texts = whisper.decode(clips, prefixes, limits)
        log.info("decoded a batch of %d", rows)
        return {"TRANSCRIPTS": np.array([[t.encode("utf-8")] for t in texts], dtype=object)}

    config = TritonConfig(
        http_address=args.host,
        http_port=args.http_port,
        grpc_address=args.host,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        exit_timeout_secs=5,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.model_name,
            infer_func=infer,
            inputs=[
                Tensor(name="WAV", dtype=np.float32, shape=(-1,)),
                Tensor(name="WAV_LENS", dtype=np.int32, shape=(1,), optional=True),
                Tensor(name="MAX_NEW_TOKENS", dtype=np.int32, shape=(1,), optional=True),
                Tensor(name="TEXT_PREFIX", dtype=bytes, shape=(1,)),
            ],
            outputs=[Tensor(name="TRANSCRIPTS", dtype=bytes, shape=(1,))],
            config=ModelConfig(
                max_batch_size=args.max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us),
            ),
            strict=True,
        )
        log.info("serving %s on http :%d, grpc :%d", args.model_name, args.http_port, args.grpc_port)
        triton.serve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True, help="a CTranslate2 Whisper directory")
    parser.add_argument("--model-name", default="infer_bls")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-queue-delay-us", type=int, default=2000, help="Triton's dynamic batcher delay")
    parser.add_argument("--max-new-tokens", type=int, default=224)
    parser.add_argument("--cpu-threads", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with contextlib.suppress(KeyboardInterrupt):
        serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
