"""The word lists of the social environment's keyword readers: the scripted partner, the heuristic evaluator,
the keyword rubrics and the built-in policy's vocabulary."""

from __future__ import annotations

import re

POLITE = {"please", "thanks", "thank", "sorry", "appreciate", "understand", "together", "fair"}
RUDE = {"stupid", "shut", "hate", "idiot", "whatever", "liar", "threat", "sue", "force", "useless"}
QUESTION = {"what", "why", "how", "which", "when", "where", "would", "could", "can"}
PROPOSE = {"offer", "propose", "suggest", "deal", "plan", "split", "share", "half", "together", "schedule", "rota"}
GENERIC_WORDS = (
    "hello hi please thanks thank you sorry yes no ok i we can could would what why how which when where "
    "offer propose suggest deal plan split share half together fair agree help understand appreciate "
    "goodbye"
).split()


def words_of(text: str) -> list[str]:
    """The lower-case words (letters and digits) of `text`, in order."""
    return re.findall(r"[a-z0-9]+", text.lower())
