-- inventory 002: stock on hand. A SKU with on_hand set cannot have more
-- reserved than that: an order that would exceed it is rejected whole
-- (StockRejected) and leaves a 'rejected' row per item, so that its
-- cancellation has nothing to release and is no anomaly. NULL (the default)
-- is unlimited stock.

ALTER TABLE inventory_stock ADD COLUMN IF NOT EXISTS on_hand bigint CHECK (on_hand >= 0);
ALTER TABLE inventory_reservations DROP CONSTRAINT IF EXISTS inventory_reservations_status_check;
ALTER TABLE inventory_reservations ADD CONSTRAINT inventory_reservations_status_check CHECK (status IN ('reserved', 'released', 'rejected'));
