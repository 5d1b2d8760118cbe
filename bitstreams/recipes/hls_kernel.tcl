# Vitis HLS: synthesize one edgehft kernel and export it as a Vivado IP.
#   vitis_hls -f recipes/hls_kernel.tcl -tclargs <kernel> <part> <clock_ns> <version> <out_dir> [<cflags>]
# <kernel>: dense_int8 | lstm_int8 (top function <kernel>_top in kernels/<kernel>.cpp).
# <cflags>: the board's kernel limits as -D defines (lanes, max sizes, slots), from the Makefile.
# The exported IP's VLNV is edgehft:hls:<kernel>:<version>; the pynq driver binds to exactly that.
set kernel  [lindex $argv 0]
set part    [lindex $argv 1]
set clk_ns  [lindex $argv 2]
set version [lindex $argv 3]
set out     [lindex $argv 4]
set defs    [lindex $argv 5]
set here    [file dirname [file normalize [info script]]]
set src     [file normalize "$here/../kernels"]

open_project -reset "$out/hls_$kernel"
set_top "${kernel}_top"
add_files "$src/$kernel.cpp" -cflags "-std=c++14 -I$src $defs"
add_files -tb "$src/tb_$kernel.cpp" -cflags "-std=c++14 -I$src $defs"
open_solution -reset "sol" -flow_target vivado
set_part $part
create_clock -period $clk_ns -name default
# C simulation runs the same source g++ builds into delegates/ on the host.
csim_design
csynth_design
export_design -format ip_catalog -vendor edgehft -library hls -version $version -ipname $kernel \
    -description "edgehft $kernel: TFLite int8 arithmetic (requantization mode named in each layer's params), ap_ctrl_hs on s_axilite"
exit
