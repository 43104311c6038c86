"""Flash sale: purchases of one SKU must never oversell (``python -m examples.flash_sale.demo``)."""
