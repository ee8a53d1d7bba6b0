"""What a Ray pod runs beside Ray itself: its lifecycle hooks (the chart's preStop)."""
