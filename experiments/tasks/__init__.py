"""Tasks: each samples batches as a pure function of (seed, step, split, length) and scores them."""

from experiments.tasks.algorithmic import ALGORITHMIC_TASKS
from experiments.tasks.base import Task
from experiments.tasks.classify import Classify
from experiments.tasks.corpus import Corpus
from experiments.tasks.forecast import Forecast
from experiments.tasks.shakespeare import Shakespeare
from experiments.tasks.tracing import Tracing
from experiments.tasks.translation import Translation

TASKS: dict[str, type[Task]] = dict(ALGORITHMIC_TASKS, shakespeare=Shakespeare, forecast=Forecast,
                                    classify=Classify, tracing=Tracing, translation=Translation, corpus=Corpus)
