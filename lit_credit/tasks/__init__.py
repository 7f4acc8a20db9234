from lit_credit.tasks.arith import ArithTask
from lit_credit.tasks.base import Environment, Feedback, Task

__all__ = ["ArithTask", "Environment", "Feedback", "Task"]
