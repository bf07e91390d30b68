# POSIX threads' mutex and condition variable, as the batch loop, its adapters and the
# engine use them.

from posix.time cimport timespec

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t * mutex, void * attr)
    int pthread_mutex_destroy(pthread_mutex_t * mutex)
    int pthread_mutex_lock(pthread_mutex_t * mutex)
    int pthread_mutex_trylock(pthread_mutex_t * mutex)
    int pthread_mutex_unlock(pthread_mutex_t * mutex)
    int pthread_cond_init(pthread_cond_t * cond, void * attr)
    int pthread_cond_destroy(pthread_cond_t * cond)
    int pthread_cond_wait(pthread_cond_t * cond, pthread_mutex_t * mutex)
    int pthread_cond_timedwait(pthread_cond_t * cond, pthread_mutex_t * mutex,
                               const timespec * abstime)   # CLOCK_REALTIME
    int pthread_cond_signal(pthread_cond_t * cond)
    int pthread_cond_broadcast(pthread_cond_t * cond)
