#!/bin/bash
sed -i 's/for line in lines)/for line in lines[1:])/' /app/total.py
