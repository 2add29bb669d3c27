/* The pod sandbox ("pause") container of the offline kind node image
 * (scripts/kind/node.sh): sleep until SIGINT or SIGTERM, reaping any child
 * that is reparented to it (it is PID 1 of the pod when the pod shares a PID
 * namespace). Built with `gcc -static`. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { _exit(128 + sig); }

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("pause (openforge)");
    return 0;
  }
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  if (getpid() != 1) fputs("pause: warning: not PID 1\n", stderr);
  for (;;) pause();
}
