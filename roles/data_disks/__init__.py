"""The data_disks role: workers' dataset and checkpoint disks, one disk or an mdadm RAID 0."""
