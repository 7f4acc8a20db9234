from lit_credit.tasks.arith import ArithTask
from lit_credit.tasks.base import Environment, Episode, Feedback, Task, TurnEnvironment
from lit_credit.tasks.code_revise import CodeReviseTask
from lit_credit.tasks.form import FormTask
from lit_credit.tasks.math_revise import MathReviseTask
from lit_credit.tasks.reasoning_gym import ReasoningGymTask as ReasoningGymTask
from lit_credit.tasks.revise import RevisionEnvironment, Verdict
from lit_credit.tasks.textarena import TextArenaTask as TextArenaTask
from lit_credit.tasks.toolcall import (
    LLMToolSimulator,
    ToolCallTask,
    ToolEnvironment,
    ToolSimulator,
    load_toucan_parquet,
)

__all__ = [
    "ArithTask",
    "CodeReviseTask",
    "Environment",
    "Episode",
    "Feedback",
    "FormTask",
    "LLMToolSimulator",
    "MathReviseTask",
    "RevisionEnvironment",
    "Task",
    "ToolCallTask",
    "ToolEnvironment",
    "ToolSimulator",
    "TurnEnvironment",
    "Verdict",
    "load_toucan_parquet",
]
