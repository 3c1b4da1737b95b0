"""Admission: what happens to an object before the store keeps it.  Defaulting on create
(pods, namespaces, Jobs, PodDisruptionBudgets, CRDs), the admission plugins the API server runs by
default (Priority, DefaultTolerationSeconds) and validation (built-in kinds' field rules, CRD
schemas and their CEL rules)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustersim.kube import errors
from clustersim.kube.crd_rules import compile_errors, rule_causes
from clustersim.kube.errors import BadRequest, Cause
from clustersim.kube.objects import Obj, now_rfc3339
from clustersim.kube.resources import ResourceInfo, crd_resource_infos
from clustersim.kube.schema import prepare_custom_object
from nodeflow_kube.quantity import QuantityError, parse_quantity

if TYPE_CHECKING:
    from clustersim.kube.objectstore import ObjectStore

PREEMPT_LOWER = "PreemptLowerPriority"


class Admission:
    """Defaults and validates objects for ``store`` (which owns it) before they are stored."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def prepare_create(self, info: ResourceInfo, obj: Obj) -> Obj:
        key = info.key
        if key == "pods":
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            for container in spec.get("containers") or []:
                if isinstance(container, dict):
                    container.setdefault("imagePullPolicy", "IfNotPresent")
                    container.setdefault("terminationMessagePolicy", "File")
            for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
                if isinstance(container, dict):
                    _default_requests_to_limits(container)
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif key == "namespaces":
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj[
                "metadata"
            ]["name"]
        elif key == "jobs.batch":
            self._prepare_job(obj)
        elif key == "poddisruptionbudgets.policy":
            obj["status"] = {
                "disruptionsAllowed": 0,
                "currentHealthy": 0,
                "desiredHealthy": 0,
                "expectedPods": 0,
            }
        elif key == "customresourcedefinitions.apiextensions.k8s.io":
            obj = self.prepare_crd(obj)
        return obj

    @staticmethod
    def _prepare_job(obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        uid = obj["metadata"]["uid"]
        name = obj["metadata"]["name"]
        spec.setdefault("parallelism", 1)
        if "completions" not in spec:
            spec["completions"] = 1
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        if not spec.get("manualSelector"):
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
            labels = template_meta.setdefault("labels", {})
            labels.update(
                {
                    "batch.kubernetes.io/controller-uid": uid,
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": uid,
                    "job-name": name,
                }
            )
        obj["status"] = {}

    def prepare_crd(self, obj: Obj) -> Obj:
        info = crd_resource_infos(obj)
        spec = obj.get("spec") or {}
        expected = f"{info.plural}.{info.group}"
        causes: list[Cause] = []
        if obj["metadata"]["name"] != expected:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{obj["metadata"]["name"]}": must '
                    f'be spec.names.plural+"."+spec.group',
                    "metadata.name",
                )
            )
        if not info.versions:
            causes.append(Cause("FieldValueRequired", "Required value", "spec.versions"))
        storage = [v for v in spec.get("versions") or [] if v.get("storage")]
        if len(storage) != 1:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    "must have exactly one version marked as storage version",
                    "spec.versions",
                )
            )
        if not info.kind:
            causes.append(Cause("FieldValueRequired", "Required value", "spec.names.kind"))
        versions = spec.get("versions") or []
        schemas = [((v or {}).get("schema") or {}).get("openAPIV3Schema") for v in versions]
        if schemas and isinstance(schemas[0], dict) and all(s == schemas[0] for s in schemas):
            # kube-apiserver validates the internal form, where a schema every version shares
            # is hoisted to spec.validation: its causes name that path.
            causes.extend(compile_errors(schemas[0], "spec.validation.openAPIV3Schema"))
        else:
            for i, schema in enumerate(schemas):
                if isinstance(schema, dict):
                    path = f"spec.versions[{i}].schema.openAPIV3Schema"
                    causes.extend(compile_errors(schema, path))
        if causes:
            raise errors.invalid(
                "CustomResourceDefinition", obj["metadata"]["name"], causes, "apiextensions.k8s.io"
            )
        names = dict(spec.get("names") or {})
        names.setdefault("singular", info.singular)
        names.setdefault("listKind", info.list_kind)
        obj["spec"]["names"] = names
        obj["status"] = {
            "acceptedNames": names,
            "storedVersions": [info.storage_version],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": now_rfc3339(),
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": now_rfc3339(),
                },
            ],
        }
        return obj

    def validate(self, info: ResourceInfo, obj: Obj, old: Obj | None) -> Obj:
        name = obj["metadata"]["name"]
        if info.is_crd:
            version = obj.get("apiVersion", "").rpartition("/")[2]
            schema = info.schemas.get(version) or info.schemas.get(info.storage_version) or {}
            if version not in info.versions:
                raise BadRequest(f"unsupported apiVersion {obj.get('apiVersion')!r} for {info.key}")
            obj, causes = prepare_custom_object(obj, schema)
            if schema:
                causes.extend(_rules_unless_blocked(obj, old, schema, causes))
            if causes:
                raise errors.invalid(info.kind, name, causes, info.group)
            return obj
        causes = []
        if info.key == "pods":
            _default_toleration_seconds(obj)
            if old is None:
                self._admit_priority(obj)
            causes = _pod_causes(obj, old)
        elif info.key == "jobs.batch":
            causes = _job_causes(obj, old)
        elif info.key == "poddisruptionbudgets.policy":
            causes = _pdb_causes(obj)
        elif info.key == "controllerrevisions.apps":
            causes = _controller_revision_causes(obj, old)
        if causes:
            raise errors.invalid(info.kind, name, causes, info.group)
        return obj

    def _admit_priority(self, pod: Obj) -> None:
        """The Priority admission plugin, on by default: a new pod's `priorityClassName`
        resolves to `spec.priority` and `spec.preemptionPolicy` from its PriorityClass (the
        globalDefault class, else 0, when it names none); a pod naming a class that does not
        exist is refused, and so is one whose own `spec.priority` differs from its class's."""
        spec = pod.setdefault("spec", {})
        name = spec.get("priorityClassName")
        classes = self._store._objects.get("priorityclasses.scheduling.k8s.io", {}).get("", {})
        chosen: Obj | None = None
        if name:
            chosen = classes.get(name)
            if chosen is None:
                raise errors.Forbidden(
                    f'pods "{pod["metadata"].get("name", "")}" is forbidden: no PriorityClass '
                    f"with name {name} was found",
                    kind="pods",
                    name=str(pod["metadata"].get("name", "")),
                )
        else:
            defaults = [c for c in classes.values() if c.get("globalDefault")]
            if defaults:
                chosen = min(defaults, key=lambda c: int(c.get("value") or 0))
                spec["priorityClassName"] = chosen["metadata"]["name"]
        value = int(chosen.get("value") or 0) if chosen is not None else 0
        given = spec.get("priority")
        if given is not None and given != value:
            raise errors.Forbidden(
                f'pods "{pod["metadata"].get("name", "")}" is forbidden: the integer value of '
                f"priority ({given}) must not be provided in pod spec; priority admission "
                f"controller computed {value} from the given PriorityClass name",
                kind="pods",
                name=str(pod["metadata"].get("name", "")),
            )
        spec["priority"] = value
        policy = chosen.get("preemptionPolicy") if chosen is not None else None
        spec["preemptionPolicy"] = policy or spec.get("preemptionPolicy") or PREEMPT_LOWER


_NODE_PROBLEM_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
DEFAULT_TOLERATION_SECONDS = 300


def _default_toleration_seconds(pod: Obj) -> None:
    """The DefaultTolerationSeconds admission plugin, on by default: a pod that does not
    tolerate the not-ready or unreachable NoExecute taint gets a 300 s toleration of it, so the
    taint manager evicts it five minutes after its node stops answering (on create and update)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    tolerations = spec.get("tolerations") or []
    for taint in _NODE_PROBLEM_TAINTS:
        tolerated = any(
            isinstance(t, dict)
            and t.get("key", "") in (taint, "")
            and t.get("effect", "") in ("NoExecute", "")
            for t in tolerations
        )
        if not tolerated:
            tolerations.append(
                {
                    "key": taint,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                }
            )
    spec["tolerations"] = tolerations


def _rules_unless_blocked(
    obj: Obj, old: Obj | None, schema: Obj, causes: list[Cause]
) -> list[Cause]:
    """The CEL rule causes; like the apiserver, rules are skipped when a value has the wrong
    type (the rules could not be evaluated meaningfully), with a cause saying so."""
    if any(c.reason == "FieldValueTypeInvalid" for c in causes):
        return [
            Cause(
                "FieldValueInvalid",
                'Invalid value: "null": some validation rules were not checked because the '
                "object was invalid; correct the existing errors to complete validation",
            )
        ]
    return rule_causes(obj, old, schema)


_POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "terminationGracePeriodSeconds")


def _overcommit_allowed(resource: str) -> bool:
    """Native resources (cpu, memory, `*kubernetes.io/*`) may be requested below their limit;
    extended ones (nvidia.com/gpu) and hugepages may not."""
    native = "/" not in resource or "kubernetes.io/" in resource
    return native and not resource.startswith("hugepages-")


def _default_requests_to_limits(container: Obj) -> None:
    """A limit without a request: the request defaults to the limit, as the API server does."""
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, dict) else None
    if not isinstance(limits, dict) or not limits:
        return
    requests = resources.setdefault("requests", {}) if isinstance(resources, dict) else None
    if isinstance(requests, dict):
        for name, quantity in limits.items():
            requests.setdefault(name, quantity)


def _same_quantity(left: object, right: object) -> bool:
    try:
        return parse_quantity(left) == parse_quantity(right)
    except QuantityError:
        return left == right


def _resource_causes(resources: object, path: str) -> list[Cause]:
    """A resource that cannot be overcommitted needs a limit, and its request must equal it."""
    if not isinstance(resources, dict):
        return []
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    if not isinstance(requests, dict) or not isinstance(limits, dict):
        return []
    causes: list[Cause] = []
    for name, quantity in requests.items():
        if _overcommit_allowed(str(name)):
            continue
        if name not in limits:
            causes.append(
                Cause(
                    "FieldValueRequired",
                    "Required value: Limit must be set for non overcommitable resources",
                    f"{path}.limits",
                )
            )
        elif not _same_quantity(quantity, limits[name]):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{quantity}": must be equal to {name} limit of {limits[name]}',
                    f"{path}.requests",
                )
            )
    return causes


def _pod_causes(obj: Obj, old: Obj | None) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(Cause("FieldValueRequired", "Required value", "spec.containers"))
    else:
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not c.get("name"):
                causes.append(
                    Cause("FieldValueRequired", "Required value", f"spec.containers[{i}].name")
                )
            elif not c.get("image"):
                causes.append(
                    Cause("FieldValueRequired", "Required value", f"spec.containers[{i}].image")
                )
    for field, listed in (
        ("containers", containers),
        ("initContainers", spec.get("initContainers")),
    ):
        for i, c in enumerate(listed if isinstance(listed, list) else ()):
            if isinstance(c, dict):
                causes.extend(_resource_causes(c.get("resources"), f"spec.{field}[{i}].resources"))
    if old is not None and not causes:
        old_spec = dict(old.get("spec") or {})
        new_spec = dict(spec)
        for key in _POD_MUTABLE_SPEC:
            old_spec.pop(key, None)
            new_spec.pop(key, None)
        old_tolerations = old_spec.pop("tolerations", None) or []
        new_tolerations = new_spec.pop("tolerations", None) or []
        for spec_ in (old_spec, new_spec):
            spec_["containers"] = [
                {k: v for k, v in c.items() if k != "image"} for c in spec_.get("containers") or []
            ]
        if old_spec != new_spec or any(t not in new_tolerations for t in old_tolerations):
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: pod updates may not change fields other "
                    "than `spec.containers[*].image`, `spec.initContainers[*].image`, "
                    "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to "
                    "existing tolerations), `spec.terminationGracePeriodSeconds`",
                    "spec",
                )
            )
    return causes


def _job_causes(obj: Obj, old: Obj | None) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    template = spec.get("template") or {}
    policy = (template.get("spec") or {}).get("restartPolicy")
    if policy not in ("Never", "OnFailure"):
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{policy or ""}": supported values: "OnFailure", "Never"',
                "spec.template.spec.restartPolicy",
            )
        )
    if not (template.get("spec") or {}).get("containers"):
        causes.append(
            Cause("FieldValueRequired", "Required value", "spec.template.spec.containers")
        )
    for key in ("parallelism", "completions", "backoffLimit"):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or value < 0):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {value}: must be greater than or equal to 0",
                    f"spec.{key}",
                )
            )
    if old is not None:
        old_spec = old.get("spec") or {}
        for key in ("template", "selector", "completionMode"):
            if old_spec.get(key) != spec.get(key):
                causes.append(Cause("FieldValueInvalid", "field is immutable", f"spec.{key}"))
    return causes


def _controller_revision_causes(obj: Obj, old: Obj | None) -> list[Cause]:
    """apps/v1 ControllerRevision, as kube-apiserver validates it: `data` is mandatory and
    immutable, `revision` a non-negative integer (the only field an update may change)."""
    causes: list[Cause] = []
    if obj.get("data") is None:
        causes.append(Cause("FieldValueRequired", "Required value: data is mandatory", "data"))
    revision = obj.get("revision", 0)
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {revision}: must be greater than or equal to 0",
                "revision",
            )
        )
    if old is not None and old.get("data") != obj.get("data"):
        causes.append(Cause("FieldValueInvalid", "field is immutable", "data"))
    return causes


def _pdb_causes(obj: Obj) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    if "minAvailable" in spec and "maxUnavailable" in spec:
        causes.append(
            Cause("FieldValueInvalid", "minAvailable and maxUnavailable cannot be both set", "spec")
        )
    for key in ("minAvailable", "maxUnavailable"):
        value = spec.get(key)
        if isinstance(value, str) and not (value.endswith("%") and value[:-1].isdigit()):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{value}": a valid percent '
                    "string must be a numeric string followed by an ending '%'",
                    f"spec.{key}",
                )
            )
        elif isinstance(value, int) and value < 0:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {value}: must be greater than or equal to 0",
                    f"spec.{key}",
                )
            )
    return causes
