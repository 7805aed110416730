"""A fixed corpus of spoken commands and questions for the benchmarks and evaluation tools.

64 sentences of the kind people say to a voice assistant (commands, questions, numbers, times,
names) plus two longer narrative ones, synthesized by the bundled Piper voice with its vocoder
noise off (``noise_scale=0``, ``noise_w_scale=0``), so every run hears exactly the same clips.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SENTENCES: tuple[str, ...] = (
    "Turn on the kitchen lights and close the garage door.",
    "What is the weather like in Paris this afternoon?",
    "Please remind me to call my mother tomorrow morning.",
    "Set a timer for the pasta and play some quiet music.",
    "The old lighthouse keeper walked slowly along the rocky shore.",
    "My neighbor planted tomatoes and beans in her small garden.",
    "Open the blinds in the bedroom.",
    "Add milk, eggs and bread to the shopping list.",
    "How long does it take to drive to the airport?",
    "Lock the front door and arm the alarm.",
    "Read me the latest news about the football match.",
    "Dim the living room lights to half.",
    "Who wrote the novel about the white whale?",
    "Start the vacuum cleaner in the hallway.",
    "Tell me a short story about a brave little fox.",
    "Turn the heating down before we go to bed.",
    "Set an alarm for seven thirty tomorrow.",
    "What time is it in Tokyo right now?",
    "Play the next song on the kitchen speaker.",
    "How many teaspoons are in a tablespoon?",
    "Turn off all the lights downstairs.",
    "Is it going to rain in London this weekend?",
    "Call Sarah on her mobile phone.",
    "Send a message to John saying I will be late.",
    "What is the capital of Australia?",
    "Open the garage door halfway.",
    "Pause the movie in the living room.",
    "Increase the volume on the television.",
    "How far away is the moon from the earth?",
    "Remind me to take out the trash on Thursday evening.",
    "Set the thermostat to twenty one degrees.",
    "What is on my calendar for Friday?",
    "Turn on the porch light at sunset.",
    "Close the curtains in the study.",
    "How do you make a simple tomato sauce?",
    "Start a fifteen minute timer for the laundry.",
    "Who won the world cup in nineteen ninety eight?",
    "Turn the fan in the office to high speed.",
    "Is the back door locked?",
    "Water the plants in the greenhouse for ten minutes.",
    "Tell me a joke about a penguin.",
    "How many days are left until Christmas?",
    "Switch the bathroom heater off.",
    "Play some relaxing jazz in the bedroom.",
    "What is the population of Canada?",
    "Stop the music and turn on the news.",
    "Show me the front door camera.",
    "Order more coffee beans from the usual shop.",
    "What is twelve times fourteen?",
    "Turn on the dishwasher after midnight.",
    "How is the traffic on the way to work?",
    "Skip this song and lower the volume a little.",
    "The children built a tall snowman in the park yesterday.",
    "A quiet river runs past the old stone mill.",
    "Please translate good morning into Spanish.",
    "Where did I park the car this morning?",
    "Turn the oven on to two hundred degrees.",
    "Let the dog out into the back garden.",
    "Check whether the windows upstairs are closed.",
    "Give me a recipe for banana bread.",
    "Wake me up at six fifteen with soft music.",
    "What is the exchange rate from euros to dollars?",
    "Put the robot vacuum back on its charger.",
    "Good night, turn everything off please.",
)

FIXTURES = REPO / "tests" / "fixtures"
# The repository's recorded fixture (AMR-WB, as Willow devices send it) and what it says.
FIXTURE_CLIPS: dict[str, str] = {
    "kitchen_lights.amr": "Turn on the kitchen lights and close the garage door.",
}


@dataclass(frozen=True)
class Utterance:
    name: str
    text: str
    audio: npt.NDArray[np.float32]  # 16 kHz mono

    @property
    def seconds(self) -> float:
        return self.audio.size / 16000


def synthesize(texts: tuple[str, ...] = SENTENCES) -> list[Utterance]:
    """Piper speech for each text, resampled to 16 kHz; identical on every run (tests/conftest.py's
    synthesis, the one every test and tool uses: noise off)."""
    from tests.conftest import synthesize as synthesize_clip

    return [
        Utterance(f"piper-{index:02d}", text, np.asarray(synthesize_clip(text).audio16k, dtype=np.float32))
        for index, text in enumerate(texts)
    ]


def fixtures() -> list[Utterance]:
    """The repository's audio fixtures, decoded to 16 kHz."""
    from mediaserver.audio.decode import decode_any

    return [
        Utterance(name, text, decode_any((FIXTURES / name).read_bytes()))
        for name, text in FIXTURE_CLIPS.items()
        if (FIXTURES / name).is_file()
    ]
