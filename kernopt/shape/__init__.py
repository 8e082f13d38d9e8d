"""The shape layer: symbolic integers (symbolic.py), Views (view.py) and ShapeTrackers (shapetracker.py).
Imports only the standard library."""
