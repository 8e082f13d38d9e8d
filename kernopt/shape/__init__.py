"""The shape layer: symbolic integers (symbolic.py), Views (view.py), ShapeTrackers (shapetracker.py) and what
mask conditions imply about index Variables (conditions.py).
Imports only the standard library."""
