"""The nodeset-controller service (see ../shared/DESIGN.md for what it owns)."""

SERVICE = "nodeset-controller"
