# Vivado: the edgehft overlay for one board = the SoC's processing system + dense_int8 + lstm_int8,
# their AXI-Lite control ports on the PS's general-purpose master, their AXI masters on an HP port.
#   vivado -mode batch -source recipes/overlay.tcl -tclargs <overlay> <part> <family> <fclk_mhz> <ip_repo> <out_dir>
# <family>: zynq (Zynq-7000, processing_system7) | zynquplus (Zynq UltraScale+, zynq_ultra_ps_e).
# Writes <out_dir>/<overlay>.bit and <out_dir>/<overlay>.hwh (same stem, as pynq expects).
set overlay [lindex $argv 0]
set part    [lindex $argv 1]
set family  [lindex $argv 2]
set fclk    [lindex $argv 3]
set ip_repo [lindex $argv 4]
set out     [lindex $argv 5]

create_project -force $overlay "$out/vivado_$overlay" -part $part
set_property ip_repo_paths $ip_repo [current_project]
update_ip_catalog
create_bd_design $overlay

if {$family eq "zynq"} {
    set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:processing_system7 ps7]
    apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 \
        -config {make_external "FIXED_IO, DDR" apply_board_preset "1"} $ps
    set_property -dict [list CONFIG.PCW_USE_S_AXI_HP0 {1} CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ $fclk] $ps
    set master "/ps7/M_AXI_GP0"
    set hp "/ps7/S_AXI_HP0"
    set clk "/ps7/FCLK_CLK0"
} else {
    set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e zynq_ultra_ps_e_0]
    apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e -config {apply_board_preset "1"} $ps
    set_property -dict [list CONFIG.PSU__USE__S_AXI_GP2 {1} CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ $fclk] $ps
    set master "/zynq_ultra_ps_e_0/M_AXI_HPM0_FPD"
    set hp "/zynq_ultra_ps_e_0/S_AXI_HP0_FPD"
    set clk "/zynq_ultra_ps_e_0/pl_clk0"
}

foreach k {dense_int8 lstm_int8} {
    create_bd_cell -type ip -vlnv edgehft:hls:$k:1.0 ${k}_0
    apply_bd_automation -rule xilinx.com:bd_rule:axi4 \
        -config [list Clk_master $clk Clk_slave $clk Clk_xbar $clk Master $master Slave "/${k}_0/s_axi_control" intc_ip {New AXI SmartConnect}] \
        [get_bd_intf_pins ${k}_0/s_axi_control]
    apply_bd_automation -rule xilinx.com:bd_rule:axi4 \
        -config [list Clk_master $clk Clk_slave $clk Clk_xbar $clk Master "/${k}_0/m_axi_gmem" Slave $hp intc_ip {Auto}] \
        [get_bd_intf_pins $hp]
}
assign_bd_address
validate_bd_design
save_bd_design
make_wrapper -files [get_files "$overlay.bd"] -top -import
launch_runs impl_1 -to_step write_bitstream -jobs 8
wait_on_run impl_1
file copy -force [glob "$out/vivado_$overlay/$overlay.runs/impl_1/*.bit"] "$out/$overlay.bit"
file copy -force [glob "$out/vivado_$overlay/$overlay.gen/sources_1/bd/$overlay/hw_handoff/$overlay.hwh"] \
    "$out/$overlay.hwh"
exit
