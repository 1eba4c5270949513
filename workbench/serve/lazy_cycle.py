"""``LazyCycle``: a ``wb.Cycle`` that crossed the wire as a view record; its other fields come when first read.

A served step's reply carries what a view of the cycle reads (the tree, the target's choices, the
accepted path, the timings: ``wire.VIEW_LEAVES_OUT`` names what it leaves out), so a notebook stepping
a remote session does not pay, every cycle, for the drafter's top-k, the target's top-2 logits and the
forward records it may never look at. Reading one of those fields fetches the full records from the
server (``fetch(cycle)``, a page of cycles from this one on) and fills them in place, so a
``LazyCycle`` reads as the full record every time: ``to_dict()``, ``dataclasses.replace``, the views and
the analyses see no difference. A copy or a pickle is a plain ``Cycle`` (fetched first).

The tensors that did travel stay in their wire form until first read too (their form is checked on
arrival; a value is unpacked, once, when read): a ``run`` streaming hundreds of cycles that nobody
looks at costs the client a JSON parse per cycle, not nine tensors (the client shares the CPU with
the engine when both are on one machine).
"""
from __future__ import annotations

from dataclasses import fields

from workbench.records.cycle import Cycle
from workbench.records.tensor_codec import check_wire_tensor, is_wire_tensor, unpack_tensor

FIELDS = fields(Cycle)  # (looked up once: fields() rebuilds its tuple at every call)
FIELD_NAMES = frozenset(f.name for f in FIELDS)
FETCH = "lazy_fetch"  # the instance dict's key for the fetch callback (not a dataclass field: never compared)
RAW = "lazy_raw"  # ... and for the tensors that travelled, still in their wire form: name -> wire dict


class NotFetched(LookupError):
    """A field of a view record read where no server can send it (the record was decoded without a session)."""


def as_cycle(values: dict) -> Cycle:
    """A plain Cycle from every field's value (what pickling and copying a LazyCycle give)."""
    return Cycle(**values)


class LazyCycle(Cycle):
    """A Cycle whose fields named in ``missing()`` are fetched from the server when first read."""

    @classmethod
    def from_view(cls, record: dict, fetch) -> "LazyCycle":
        """``record``: a view record's fields as they travelled (tensors in their wire form: checked here, unpacked
        when first read); ``fetch(cycle)``: fills the fields it lacks in place (None: reading them raises
        NotFetched). Those fields, and the tensors, are made by ``Cycle.from_dict`` from placeholders, then
        removed, so that a read reaches ``__getattr__``."""
        raw = {}
        for name, v in record.items():
            if name in FIELD_NAMES and is_wire_tensor(v):
                try:
                    check_wire_tensor(v)
                except ValueError as e:
                    raise ValueError(f"field {name!r}: {e}") from None
                raw[name] = v
        plain = {k: v for k, v in record.items() if k not in raw}
        absent = [f.name for f in FIELDS if f.name not in plain]
        c = cls.from_dict(plain, defaults={name: () for name in absent})
        for name in absent:
            if name in c.__dict__:  # a field with a default that the record lacked stays as the default
                object.__delattr__(c, name)
        c.__dict__[RAW] = raw
        c.__dict__[FETCH] = fetch
        return c

    def missing(self) -> list[str]:
        """The fields not fetched yet (empty once complete); a tensor that travelled is not missing, read or not."""
        raw = self.__dict__.get(RAW, {})
        return [name for name in sorted(FIELD_NAMES) if name not in self.__dict__ and name not in raw]

    def fill(self, full: Cycle) -> None:
        """Take the fields this record lacks from ``full``, the same cycle's whole record."""
        if full.index != self.index:
            raise ValueError(f"cycle {full.index}'s record cannot complete cycle {self.index}")
        for name in self.missing():
            object.__setattr__(self, name, getattr(full, name))

    def __getattr__(self, name: str):
        # Called only for attributes not found the ordinary way: a tensor not unpacked yet, a missing field, or a
        # name that is none.
        if name not in FIELD_NAMES:
            raise AttributeError(f"'Cycle' object has no attribute {name!r}")
        packed = self.__dict__.get(RAW, {}).get(name)
        if packed is not None:
            try:
                value = unpack_tensor(packed)
            except (KeyError, TypeError, ValueError, RuntimeError) as e:  # (its form was checked on arrival)
                why = f"no {e}" if isinstance(e, KeyError) else " ".join(str(e).split())[:200]
                raise ValueError(f"cycle {self.__dict__.get('index')}'s {name}: {why}") from None
            object.__setattr__(self, name, value)  # (two threads reading it at once unpack the same value twice)
            self.__dict__[RAW].pop(name, None)
            return value
        if name in self.__dict__:  # another thread unpacked it since this read began
            return self.__dict__[name]
        fetch = self.__dict__.get(FETCH)
        if fetch is None:
            raise NotFetched(f"cycle {self.__dict__.get('index')}'s {name} did not travel (a view record) and no "
                             "session can send it: ask the server with records='full'")
        fetch(self)
        if name not in self.__dict__:
            raise NotFetched(f"the server sent no {name} for cycle {self.__dict__['index']}")
        return self.__dict__[name]

    def __reduce__(self):
        # A copy or a pickle is the whole record as a plain Cycle: the fetch callback (a live HTTP client)
        # neither copies nor pickles, and the copy must read the same once the session is gone.
        return as_cycle, ({f.name: getattr(self, f.name) for f in FIELDS},)


class FetchedField:
    """A field of ``Cycle`` that has a class-level default (``state_from = None``): without this, a view record
    lacking it would read the class's default instead of reaching ``__getattr__`` and fetching the value. A
    non-data descriptor: once the field is in the instance's ``__dict__`` it is read from there directly."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        return obj.__getattr__(self.name)


for _field in FIELDS:  # every defaulted field, shadowed on LazyCycle only (plain Cycles are untouched)
    if hasattr(Cycle, _field.name):
        setattr(LazyCycle, _field.name, FetchedField(_field.name))
