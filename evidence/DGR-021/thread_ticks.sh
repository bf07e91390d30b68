# user and system clock ticks of each thread of process $1 (run before and after a load):
#   bash thread_ticks.sh PID > before; ...; bash thread_ticks.sh PID > after
PID=$1; for t in /proc/$PID/task/*; do echo "$(cat $t/comm) $(awk '{print $14, $15}' $t/stat)"; done
