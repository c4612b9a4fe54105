"""What many visitors of one app process share: the model turn, the loaded models, session records.

Plain Python objects held by the app module for the life of the process — not in a framework
cache that any browser can clear — each bounded (queue order, memory cap, entries and age).
"""

from .models import ModelEntry, ModelStore
from .sessions import SessionStore
from .turns import FairLock

__all__ = ["FairLock", "ModelEntry", "ModelStore", "SessionStore"]
