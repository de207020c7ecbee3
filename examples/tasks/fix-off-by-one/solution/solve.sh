#!/bin/bash
sed -i 's/in range(a, b):/in range(a, b + 1):/' /app/mathutils.py
