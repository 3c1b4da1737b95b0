"""Slurm error numbers and texts the emulator answers with, and the HTTP status slurmrestd
derives from each (src/common/http.c `http_status_errors`; anything unlisted is a 500)."""

from __future__ import annotations

from dataclasses import dataclass

SLURM_ERROR = -1
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR = 1800
SLURM_NO_CHANGE_IN_DATA = 1900
ESLURM_INVALID_PARTITION_NAME = 2000
ESLURM_ACCESS_DENIED = 2002
ESLURM_REQUESTED_NODES_NOT_IN_PARTITION = 2004
ESLURM_JOB_SCRIPT_MISSING = 2009
ESLURM_USER_ID_MISSING = 2010
ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE = 2014
ESLURM_NODES_BUSY = 2016
ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2018
ESLURM_ALREADY_DONE = 2021
ESLURM_INVALID_NODE_STATE = 2028
ESLURM_RESERVATION_INVALID = 2053
ESLURM_INVALID_TIME_VALUE = 2054
# Slurm 26.05.5 refuses a RESUME of a node neither drained nor down with this (24.11.5: 2028).
ESLURM_INVALID_NODE_STATE_TRANSITION = 2180
ESLURM_REST_INVALID_QUERY = 9000
ESLURM_REST_FAIL_PARSING = 9001

ERROR_TEXT: dict[int, str] = {
    SLURM_ERROR: "Unspecified error",
    SLURM_PROTOCOL_AUTHENTICATION_ERROR: "Protocol authentication error",
    SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR: (
        "Unable to contact slurm controller (connect failure)"
    ),
    SLURM_NO_CHANGE_IN_DATA: "Data has not changed since time specified",
    ESLURM_INVALID_PARTITION_NAME: "Invalid partition name specified",
    ESLURM_ACCESS_DENIED: "Access/permission denied",
    ESLURM_REQUESTED_NODES_NOT_IN_PARTITION: "Requested nodes not in this partition",
    ESLURM_JOB_SCRIPT_MISSING: "Job script not specified",
    ESLURM_USER_ID_MISSING: "Invalid user id",
    ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE: "Requested node configuration is not available",
    ESLURM_NODES_BUSY: "Requested nodes are busy",
    ESLURM_INVALID_JOB_ID: "Invalid job id specified",
    ESLURM_INVALID_NODE_NAME: "Invalid node name specified",
    ESLURM_ALREADY_DONE: "Job/step already completing or completed",
    ESLURM_INVALID_NODE_STATE: "Invalid node state specified",
    ESLURM_INVALID_NODE_STATE_TRANSITION: "Invalid node state transition",
    ESLURM_RESERVATION_INVALID: "Requested reservation is invalid",
    ESLURM_INVALID_TIME_VALUE: "Invalid time specified",
    ESLURM_REST_INVALID_QUERY: "Query empty or not RFC7320 compliant",
    ESLURM_REST_FAIL_PARSING: "Failed to parse query",
}

_HTTP_STATUS: dict[int, int] = {
    SLURM_NO_CHANGE_IN_DATA: 304,
    ESLURM_REST_INVALID_QUERY: 422,
    ESLURM_REST_FAIL_PARSING: 400,
    ESLURM_INVALID_JOB_ID: 404,
    ESLURM_INVALID_NODE_STATE_TRANSITION: 422,
    SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR: 502,
    SLURM_PROTOCOL_AUTHENTICATION_ERROR: 511,
}


def http_status_for(error_number: int) -> int:
    return _HTTP_STATUS.get(error_number, 500)


@dataclass(frozen=True)
class SlurmError(Exception):
    """A failure that slurmrestd reports as one entry of `errors`."""

    error_number: int
    description: str
    source: str

    def __str__(self) -> str:
        return f"{self.source}: {self.description} ({self.error_number})"

    def as_entry(self) -> dict[str, object]:
        return {
            "description": self.description,
            "error_number": self.error_number,
            "error": ERROR_TEXT.get(self.error_number, ERROR_TEXT[SLURM_ERROR]),
            "source": self.source,
        }
