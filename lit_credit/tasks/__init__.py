from lit_credit.tasks.arith import ArithTask
from lit_credit.tasks.base import Environment, Feedback, Task
from lit_credit.tasks.toolcall import (
    LLMToolSimulator,
    ToolCallTask,
    ToolEnvironment,
    ToolSimulator,
    load_toucan_parquet,
)

__all__ = ["ArithTask", "Environment", "Feedback", "LLMToolSimulator", "Task", "ToolCallTask", "ToolEnvironment",
           "ToolSimulator", "load_toucan_parquet"]
