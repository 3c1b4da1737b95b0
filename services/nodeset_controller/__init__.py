"""The nodeset-controller service (see docs/nodeset-controller.md for the rules it implements)."""

SERVICE = "nodeset-controller"
