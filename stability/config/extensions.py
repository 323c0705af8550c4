"""Extensions: other packages' modules that register stress cases, formats, probes, quantization schemes
or arms, imported once in every process that trains or judges, before any work.

An extension is named in one of two ways:

* by its package, as an entry point of the group ``stability.extensions`` (found in every environment the
  package is installed in; nothing to configure)::

      [project.entry-points."stability.extensions"]
      myteam = "myteam.stability_ext"             # a module: importing it registers
      other = "other.ext:register"                # or a function of no arguments, called once

* by the config: ``plugins`` (``--set plugins=myteam.ext``; ``plugins = ["myteam.ext"]`` in
  ``[tool.stability]``), a module or ``module:function`` as above, for code that is not installed.

``load(names)`` imports every entry point of the group and every named module, each once per process, and
returns what this process has loaded; ``loaded()`` says it again, for the record's environment
(``env.extensions``). The command line (every subcommand, so every torchrun rank), the pytest plugin and
every Ray worker call it. One that fails to import stops the command before anything trains:
``ExtensionError`` (a ``ConfigError``: exit 2) names the extension and the error. Imports nothing of the
harness.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points

from stability.config.errors import ConfigError

GROUP = "stability.extensions"


class ExtensionError(ConfigError):
    """An extension could not be loaded; the message names it, where it was named and the error."""


@dataclass(frozen=True)
class Extension:
    """One loaded extension: its name (the entry point's, or the spec itself), the ``module[:function]`` it
    names, where it was named ("entry point" or "config") and the version of the distribution that declares
    it (None for one named by the config)."""

    name: str
    spec: str
    source: str
    version: str | None

    def describe(self) -> dict:
        return asdict(self)


_LOADED: dict[str, Extension] = {}   # spec -> extension, in the order loaded: what this process has imported
_SCANNED: list[bool] = []            # [True] once this process has loaded the group's entry points


def declared() -> list[Extension]:
    """The entry points of ``GROUP`` in the environments on ``sys.path``, sorted by name."""
    found = []
    for point in entry_points(group=GROUP):
        version = point.dist.version if point.dist is not None else None
        found.append(Extension(point.name, point.value, "entry point", version))
    return sorted(found, key=lambda extension: extension.name)


class NotFound(LookupError):
    """The module imported, but has no attribute of the name asked for."""


def import_target(spec: str):
    """What ``spec`` names: ``"module"`` the module, ``"module:name"`` (or ``"module:name.attribute"``) the object
    the module holds under that name. The module's own import errors propagate; ``NotFound`` when the module
    imported but lacks the name. Every "module:function" of the harness (extensions, ``model.factory``) is
    resolved here."""
    module_name, _, attribute = spec.partition(":")
    target = importlib.import_module(module_name.strip())
    for part in filter(None, attribute.strip().split(".")):
        if not hasattr(target, part):
            raise NotFound(f"module {module_name.strip()!r} has no {attribute.strip()!r}")
        target = getattr(target, part)
    return target


def _import(extension: Extension) -> None:
    where = f"entry point {extension.name!r} of {GROUP}" if extension.source == "entry point" else "plugins"
    try:
        target = import_target(extension.spec)
        if extension.spec.partition(":")[2].strip():     # module:function: call it
            target()
    except Exception as error:   # the extension's own error, whatever it is, stops the command with its name
        first = (str(error).strip().splitlines() or [""])[0]
        raise ExtensionError(f"extension {extension.spec!r} ({where}) failed to load: {type(error).__name__}: "
                             f"{first}: expected a module (or module:function) this Python can import") from error


def check_spec(name) -> None:
    """ExtensionError unless ``name`` reads as ``module`` or ``module:function``."""
    module, _, function = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not module.strip() or ":" in function or (":" in name and not function.strip()):
        raise ExtensionError(f"plugins entry {name!r} is invalid: expected 'module' or 'module:function'")


def load(names: tuple[str, ...] | list[str] = ()) -> list[Extension]:
    """Import the group's entry points (once per process: the first call looks them up) and the modules
    ``names`` (``module`` or ``module:function``), each once per process; every extension this process has
    loaded. ExtensionError when one fails."""
    for name in names:
        check_spec(name)
    wanted = [] if _SCANNED else declared()
    wanted += [Extension(name.strip(), name.strip(), "config", None) for name in names]
    for extension in wanted:
        if extension.spec not in _LOADED:
            _import(extension)
            _LOADED[extension.spec] = extension
    _SCANNED[:] = [True]
    return loaded()


def loaded() -> list[Extension]:
    """What this process has loaded, in order."""
    return list(_LOADED.values())


def not_loaded(names) -> list[str]:
    """Of the extensions ``names`` (``module[:function]``, as a record or a baseline names them), those this
    process has not loaded. A file's names are only compared, never imported: a process's extensions come
    from its installed entry points and its own configuration."""
    here = {extension.spec for extension in _LOADED.values()}
    return [name.strip() for name in names if isinstance(name, str) and name.strip() not in here]
