"""Planning: shape and value inference, lowering to tasks, arena placement and the plan verifier.

Used by the compiler (with the model's declared shapes) and by the runtime (again, for each new
input signature); needs only numpy and the kernel library.
"""

from .arena import ALGORITHMS, Block, place, picture
from .infer import propagate, specialize
from .lower import lower
from .program import ARENA, DYNAMIC, INPUT, OUTPUT, WEIGHT, Placement, Program, Task
from .verify import PlanError, verify

__all__ = ["ALGORITHMS", "ARENA", "Block", "DYNAMIC", "INPUT", "OUTPUT", "PlanError", "Placement", "Program",
           "Task", "WEIGHT", "lower", "picture", "place", "propagate", "specialize", "verify"]
