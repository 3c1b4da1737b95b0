"""The simulated batch/v1 Job controller: applies `joblogic.plan_job` to the store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import UTC, datetime

import structlog

from clustersim.cluster.joblogic import (
    JOB_TRACKING_FINALIZER,
    plan_job,
    pod_from_template,
    pod_name_for,
)
from clustersim.cluster.loop import Controller, Obj, pod_key
from clustersim.kube.errors import AlreadyExists, Conflict, NotFound
from clustersim.kube.store import Store

log = structlog.get_logger("clustersim.jobs")

JobKey = tuple[str, str]


def controlling_job(pod: Obj) -> str | None:
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("kind") == "Job" and owner.get("controller"):
            return str(owner.get("name"))
    return None


class JobController(Controller[JobKey]):
    name = "job-controller"
    watched = ("jobs.batch", "pods")

    def __init__(self, store: Store, backoff_seconds: float = 10.0) -> None:
        super().__init__(store)
        self.backoff_seconds = backoff_seconds

    def keys_for(self, resource: str, event: str, obj: Obj, old: Obj | None) -> Iterable[JobKey]:
        if resource == "jobs.batch":
            return (pod_key(obj),)
        job = controlling_job(obj)
        if job is None:
            return ()
        return ((obj["metadata"]["namespace"], job),)

    def initial_keys(self) -> Iterable[JobKey]:
        return [pod_key(job) for job in self.store.list("jobs.batch").items]

    def _owned_pods(self, namespace: str, uid: str) -> list[Obj]:
        selector = f"batch.kubernetes.io/controller-uid={uid}"
        pods = self.store.list("pods", namespace, label_selector=selector).items
        return [
            p
            for p in pods
            if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])
        ]

    def reconcile(self, key: JobKey) -> float | None:
        namespace, name = key
        try:
            job = self.store.get("jobs.batch", name, namespace)
        except NotFound:
            self._release_orphans(namespace, name)
            return None
        pods = self._owned_pods(namespace, job["metadata"]["uid"])
        if job["metadata"].get("deletionTimestamp"):
            for pod in pods:
                self._release(pod)
            return None
        plan = plan_job(job, pods, datetime.now(UTC), self.backoff_seconds)
        if plan.status != (job.get("status") or {}):
            self.store.patch(
                "jobs.batch",
                name,
                {"metadata": {"uid": job["metadata"]["uid"]}, "status": plan.status},
                namespace=namespace,
                subresource="status",
            )
        # Counted into status above, so the tracking finalizers can go now.
        by_name = {p["metadata"]["name"]: p for p in pods}
        for pod_name in plan.release_finalizers:
            self._release(by_name[pod_name])
        for _ in range(plan.create_pods):
            self._create_pod(job)
        for pod_name in plan.delete_pods:
            with contextlib.suppress(NotFound):
                self.store.delete("pods", pod_name, namespace)
        if plan.delete_job:
            log.info("ttl expired, deleting job", job=f"{namespace}/{name}")
            with contextlib.suppress(NotFound, Conflict):
                self.store.delete(
                    "jobs.batch",
                    name,
                    namespace,
                    propagation_policy="Background",
                    preconditions={"uid": job["metadata"]["uid"]},
                )
            return None
        return plan.requeue_after

    def _create_pod(self, job: Obj) -> None:
        for _ in range(5):
            try:
                self.store.create("pods", pod_from_template(job, pod_name_for(job)))
                return
            except AlreadyExists:
                continue

    def _release(self, pod: Obj) -> None:
        finalizers = pod["metadata"].get("finalizers") or []
        if JOB_TRACKING_FINALIZER not in finalizers:
            return
        remaining = [f for f in finalizers if f != JOB_TRACKING_FINALIZER]
        with contextlib.suppress(NotFound, Conflict):
            self.store.patch(
                "pods",
                pod["metadata"]["name"],
                {
                    "metadata": {
                        "uid": pod["metadata"]["uid"],
                        "finalizers": remaining or None,
                    }
                },
                namespace=pod["metadata"]["namespace"],
            )

    def _release_orphans(self, namespace: str, job_name: str) -> None:
        """A deleted Job's pods must not be held forever by the tracking finalizer."""
        selector = f"batch.kubernetes.io/job-name={job_name}"
        for pod in list(self.store.list("pods", namespace, label_selector=selector).items):
            if controlling_job(pod) == job_name:
                try:
                    self.store.get("jobs.batch", job_name, namespace)
                except NotFound:
                    self._release(pod)
